"""What the GPU VM's resources look like, as plain data (pure decisions, no Pulumi).

The Pulumi component in ``infra/`` turns these into resources; keeping the decisions here lets
tables of cases test them, and keeps names and settings identical wherever they are needed
(the ``fab`` tasks find the VM by the same name).
"""

from __future__ import annotations

import base64
import functools
import gzip
import ipaddress
import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

from gpu_train.catalog import disks
from gpu_train.catalog.model import Catalog
from gpu_train.gcp import artifacts, images, provisioning
from gpu_train.gcp.validate import GpuShape, node_shapes
from gpu_train.stack.agentdoc import ROOT_PART, agent_settings, job_grace_s, shutdown_grace_s
from gpu_train.stack.settings import StackConfig
from gpu_train.stack.values import LOGIN_RE

STARTUP_TEMPLATE = Path(__file__).parent.parent / "data" / "startup-script.sh.in"
CONTAINERS_TEMPLATE = STARTUP_TEMPLATE.with_name("containers.sh.in")  # its block for gpu-train:image

# Roles of the VM's own service account: write logs and metrics, nothing else.
SERVICE_ACCOUNT_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter")
SERVICE_ACCOUNT_SCOPES = (
    "https://www.googleapis.com/auth/logging.write",
    "https://www.googleapis.com/auth/monitoring.write",
)
# With gpu-train:bucket: object read/write (no bucket admin, no ACLs) on that bucket only, granted on
# the bucket itself; the storage scope that lets the VM's token reach Cloud Storage at all.
BUCKET_ROLE = "roles/storage.objectUser"  # conditioned to the stack's own prefix (infra/bucket.py)
BUCKET_DATA_ROLE = "roles/storage.objectViewer"  # conditioned to the pushed data's prefix: read only
STORAGE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
# With the recovery function: the VM reads its own labels (the function's record of it) at boot, with
# compute.instances.get granted on itself only (infra/recovery.py).
COMPUTE_READ_SCOPE = "https://www.googleapis.com/auth/compute.readonly"


def scopes(cfg: StackConfig) -> list[str]:
    """The VM's OAuth scopes: logs and metrics, Cloud Storage only with a bucket, Compute (read) only where
    a recovery function keeps its record in the VM's labels."""
    return [
        *SERVICE_ACCOUNT_SCOPES,
        *([STORAGE_SCOPE] if cfg.bucket else []),
        *([COMPUTE_READ_SCOPE] if provisioning.recovered(cfg) else []),
        *([artifacts.PULL_SCOPE] if artifacts.repository(cfg.image) and not cfg.bucket else []),  # (read_write covers it)
    ]


SSH_ALLOW_PRIORITY = 900  # beats the default network's default-allow-ssh (65534) ...
SSH_DENY_PRIORITY = 910  # ... and this deny closes port 22 to everyone else, for this VM only
# The nodes' own traffic, SSH included (node 0 passes the code on to the others over it), must beat
# that deny: Compute Engine applies the rule of lowest priority number, a deny winning a tie.
INTERNAL_PRIORITY = SSH_ALLOW_PRIORITY
# Inputs of the instance Pulumi ignores once deployed: the image is resolved from its family at
# `up` and then pinned, so a newer image never replaces the VM. (The recovery function's record is labels
# of its own, gpu-train-rec-*: pulumi-gcp's `labels` manage only the keys the program declares.)
INSTANCE_IGNORE_CHANGES = ("bootDisk.initializeParams.image",)
# The data disk's device name: the VM sees it as /dev/disk/by-id/google-gpu-train-data whatever
# order disks attach in, so the startup script mounts it by this name.
DATA_DEVICE_NAME = "gpu-train-data"


def grace_words(cfg: StackConfig) -> str:
    """What time a job really has when Compute Engine stops or preempts this stack's VM, for `plan`."""
    notice = (
        f"a notice {cfg.preemption_notice_s} s before it (metadata `preempted`, $GPU_TRAIN_NOTICE), then "
        if cfg.preemption_notice_s
        else ""
    )
    kind = "spot VM: at a preemption, " + notice if cfg.spot else "standard VM: at any stop, "
    return (
        f"{kind}{shutdown_grace_s(cfg.spot)} s between the soft-off and a hard power-off; jobs get SIGTERM, then "
        f"{job_grace_s(cfg)} s to checkpoint before SIGKILL"
    )


def data_disk_type(cfg: StackConfig, catalog: Catalog, machine_type: str | None = None) -> str:
    """``dataDiskType``, else the default of the node's series (the catalog's disks table)."""
    return cfg.data_disk_type or disks.default_disk_type(catalog, machine_type or cfg.machine_type)


def node_machine_types(cfg: StackConfig, catalog: Catalog) -> list[str]:
    """Each node's machine type, in node order (pools may differ)."""
    return [shape.machine_type for shape in node_shapes(cfg, catalog)]


def bundled_local_ssd(machine_type: str, catalog: Catalog) -> bool:
    """The shape comes with Local SSD (A2 Ultra, A3, A4): every stop must say discardLocalSsd."""
    fixed = catalog.fixed_shapes.get(machine_type)
    return fixed is not None and fixed.local_ssd


def has_local_ssd(cfg: StackConfig, catalog: Catalog) -> bool:
    """Some node of the stack has bundled Local SSD."""
    return any(bundled_local_ssd(m, catalog) for m in node_machine_types(cfg, catalog))


def instance_ignore_changes(machine_type: str, catalog: Catalog) -> list[str]:
    """What Pulumi leaves alone on this node once deployed: the pinned image, and on a shape with bundled Local
    SSD its power state, which the provider cannot change (its stop names no discardLocalSsd:
    terraform-provider-google#26173): `vm-stop`/`vm-start` do it through the Compute API."""
    return [*INSTANCE_IGNORE_CHANGES, *(["desiredStatus"] if bundled_local_ssd(machine_type, catalog) else [])]


def node_desired_status(cfg: StackConfig, machine_type: str, catalog: Catalog) -> str:
    """The status a node is created with: ``running``'s, except a Local SSD shape, created RUNNING (the
    provider would stop it right after creating it, and that stop fails the same way)."""
    return desired_status(cfg.running or bundled_local_ssd(machine_type, catalog))


def data_disk_monthly_cost(cfg: StackConfig, catalog: Catalog) -> float | None:
    """USD a month for every node's data disk (it bills while it exists, VM running or not); None: unknown."""
    prices = [catalog.disk_prices.get(data_disk_type(cfg, catalog, m)) for m in node_machine_types(cfg, catalog)]
    known = [p for p in prices if p is not None]
    return None if len(known) < len(prices) else round(sum(known) * cfg.data_disk_size_gb, 2)


def node_roles(cfg: StackConfig) -> list[str]:
    """chief, then workers, then parameter servers: each pool's role per node ('worker' without pools)."""
    if not cfg.pools:
        return ["chief"] + ["worker"] * (cfg.nodes - 1)
    return [p.role for p in cfg.pools for _ in range(p.count)]


def placement_policy(nodes: int, machine_type: str | list[str], catalog: Catalog) -> dict[str, object] | None:
    """A compact group placement for a cluster whose series (every pool's) support one (validation says
    when not)."""
    types = [machine_type] if isinstance(machine_type, str) else machine_type
    if nodes < 2 or any(catalog.series_of(m) not in catalog.compact_series for m in types):
        return None
    return {"collocation": "COLLOCATED", "vm_count": nodes}


def nic_type(machine_type: str, catalog: Catalog) -> str | None:
    """gVNIC for the series that take nothing else (A3, A4, G4); the image default elsewhere."""
    return "GVNIC" if catalog.series_of(machine_type) in catalog.gvnic_series else None


def label_value(text: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def labels(cfg: StackConfig, pulumi_project: str) -> dict[str, str]:
    return {**cfg.labels, "gpu-train-stack": label_value(cfg.stack), "gpu-train-project": label_value(pulumi_project)}


def desired_status(running: bool) -> str:
    """A stopped VM bills no GPU and no vCPU, and keeps its disk."""
    return "RUNNING" if running else "TERMINATED"


def tick_interval_s(idle_stop_minutes: float) -> int:
    """How often the idle check runs: a fifth of the idle time, between 10 s and a minute."""
    return int(min(60, max(10, idle_stop_minutes * 60 / 5))) if idle_stop_minutes > 0 else 60


def root_settings(cfg: StackConfig) -> dict[str, object]:
    """/etc/gpu-train/agent.json on the VM: what the root-installed units run with (root-owned;
    the user's REMOTE_ROOT/agent.json never reaches them)."""
    return replace(agent_settings(cfg), user=cfg.ssh_user, remote_root=cfg.remote_root).to_json(only=ROOT_PART)


def data_disk_marks(cfg: StackConfig) -> tuple[tuple[str, str], ...]:
    """The startup script's data-disk block: its device name, user and REMOTE_ROOT, shell-quoted
    (``~/`` is left for the script to expand to the user's home)."""
    root = cfg.remote_root.rstrip("/") or "/"
    quoted = "'~/'" + shlex.quote(root[2:]) if root.startswith("~/") else shlex.quote(root)
    return (("@DATA_DEVICE@", DATA_DEVICE_NAME), ("@DATA_USER@", shlex.quote(cfg.ssh_user)), ("@DATA_ROOT@", quoted))


def read_startup_template() -> str:
    """data/startup-script.sh.in with its containers block (data/containers.sh.in), for ``startup_script``
    (read by the caller: the decisions read no files)."""
    block = CONTAINERS_TEMPLATE.read_text(encoding="utf-8")
    return STARTUP_TEMPLATE.read_text(encoding="utf-8").replace("@CONTAINERS@\n", block)


@functools.lru_cache(maxsize=4)
def packed_agent(agent_zipapp: bytes) -> str:
    """The agent as the startup script carries it: gzip (mtime 0, so the same zipapp packs to the same text),
    then base64. Packed once for the last few zipapps: every node of a plan, and every plan of a process (the
    dashboard, the tests), carries the same one, and packing it takes 25 ms of CPU."""
    return base64.b64encode(gzip.compress(agent_zipapp, mtime=0)).decode()


def startup_script(cfg: StackConfig, agent_zipapp: bytes, template: str) -> str:
    """Runs as root at every boot: install the agent and its systemd units (``template``).

    Every stack value goes in shell-quoted; the units name fixed paths and the user only. Before the units, the
    data disk (device ``DATA_DEVICE_NAME``) is formatted if new and mounted on REMOTE_ROOT.
    """
    if not LOGIN_RE.fullmatch(cfg.ssh_user):  # validation refuses it first; the units must never see one
        raise ValueError(f"sshUser {cfg.ssh_user!r} is not a login name")
    packed = packed_agent(agent_zipapp)
    values = {
        "@USER@": shlex.quote(cfg.ssh_user),
        "@SETTINGS@": shlex.quote(json.dumps(root_settings(cfg), sort_keys=True)),
        "@PACKED@": shlex.quote(packed),
        "@GRACE@": str(job_grace_s(cfg)),
        "@TICK@": str(tick_interval_s(cfg.idle_stop_minutes)),
        **dict(data_disk_marks(cfg)),
        "@IMAGES@": shlex.quote(cfg.image or ""),  # gpu-train:image: Docker made ready, the image pulled at boot
        "@DATA_MNT@": shlex.quote(f"/mnt/disks/{DATA_DEVICE_NAME}"),
    }
    return re.sub("|".join(map(re.escape, values)), lambda m: values[m.group(0)], template)


def metadata(cfg: StackConfig, public_key: str, agent_zipapp: bytes, template: str) -> dict[str, str]:
    """Only our key logs in (project-wide keys blocked, OS Login off); the startup script installs
    the on-host agent at every boot. The driver is installed at first boot only for a family that
    does not ship one (``*-nvidia-DRIVER`` families have it: no install, no reboot)."""
    key = " ".join(public_key.split()[:2])  # type and key, with our user as the comment
    driver = {} if images.driver_of(cfg.image_family) is not None else {"install-nvidia-driver": "True"}
    return {
        **driver,
        "ssh-keys": f"{cfg.ssh_user}:{key} {cfg.ssh_user}",
        "block-project-ssh-keys": "TRUE",
        "enable-oslogin": "FALSE",
        "startup-script": startup_script(cfg, agent_zipapp, template),
    }


def guest_accelerators(shape: GpuShape) -> list[dict[str, object]]:
    """N1 gets its GPUs attached; fixed shapes come with theirs and must list none."""
    return [{"type": shape.gpu_type, "count": shape.gpu_count}] if shape.attached else []


def ssh_ranges_by_family(ranges: tuple[str, ...]) -> dict[str, list[str]]:
    """A firewall rule takes IPv4 or IPv6 sources, not both: split them."""
    out: dict[str, list[str]] = {}
    for r in ranges:
        family = "ipv6" if ipaddress.ip_network(r, strict=False).version == 6 else "ipv4"
        out.setdefault(family, []).append(r)
    return out
