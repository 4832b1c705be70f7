"""What the GPU VM's resources look like, as plain data (pure decisions, no Pulumi).

The Pulumi component in ``infra/`` turns these into resources; keeping the decisions here lets
tables of cases test them, and keeps names and settings identical wherever they are needed
(the ``fab`` tasks find the VM by the same name).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import ipaddress
import json
import re
from pathlib import Path

from gpu_train.config import StackConfig
from gpu_train.validate import GpuShape

STARTUP_TEMPLATE = Path(__file__).parent / "data" / "startup-script.sh.in"

# Roles of the VM's own service account: write logs and metrics, nothing else.
SERVICE_ACCOUNT_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter")
SERVICE_ACCOUNT_SCOPES = (
    "https://www.googleapis.com/auth/logging.write",
    "https://www.googleapis.com/auth/monitoring.write",
)
SSH_ALLOW_PRIORITY = 900  # beats the default network's default-allow-ssh (65534) ...
SSH_DENY_PRIORITY = 910  # ... and this deny closes port 22 to everyone else, for this VM only


def _rfc1035(text: str, max_len: int) -> str:
    """A Compute Engine resource name: lower case, digits and '-', starting with a letter."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = "g-" + name
    if len(name) > max_len:  # keep names unique when cut: end with a short hash of the whole
        digest = hashlib.sha256(text.encode()).hexdigest()[:6]
        name = name[: max_len - 7].rstrip("-") + "-" + digest
    return name.rstrip("-")


def instance_name(stack: str, node: int | None = None) -> str:
    """gpu-train-STACK for one VM; gpu-train-STACK-0 ... -N-1 for a cluster."""
    base = _rfc1035(f"gpu-train-{stack}", 63 if node is None else 63 - len(f"-{node}"))
    return base if node is None else f"{base}-{node}"


def node_names(stack: str, nodes: int) -> list[str]:
    return [instance_name(stack)] if nodes == 1 else [instance_name(stack, i) for i in range(nodes)]


def placement_policy(nodes: int, machine_type: str, catalog) -> dict[str, object] | None:
    """A compact group placement for a cluster whose series supports one (validation says when not)."""
    if nodes < 2 or catalog.series_of(machine_type) not in catalog.compact_series:
        return None
    return {"collocation": "COLLOCATED", "vm_count": nodes}


def nic_type(machine_type: str, catalog) -> str | None:
    """gVNIC for the series that take nothing else (A3, A4, G4); the image default elsewhere."""
    return "GVNIC" if catalog.series_of(machine_type) in catalog.gvnic_series else None


def network_tag(stack: str) -> str:
    return instance_name(stack)


def service_account_id(stack: str) -> str:
    """6 to 30 characters, as IAM requires."""
    return _rfc1035(f"gpu-train-{stack}", 30).ljust(6, "0")


def label_value(text: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def labels(cfg: StackConfig, pulumi_project: str) -> dict[str, str]:
    return {**cfg.labels, "gpu-train-stack": label_value(cfg.stack), "gpu-train-project": label_value(pulumi_project)}


def scheduling(spot: bool, max_run_hours: int | None = None) -> dict[str, object]:
    """GPUs cannot live-migrate, so host maintenance always TERMINATEs; spot VMs STOP (keeping the disk).

    ``max_run_hours`` is a hard cap: Compute Engine STOPs the VM when it has run that long.
    """
    if spot:
        out: dict[str, object] = {
            "on_host_maintenance": "TERMINATE",
            "provisioning_model": "SPOT",
            "preemptible": True,
            "automatic_restart": False,
            "instance_termination_action": "STOP",
        }
    else:
        out = {"on_host_maintenance": "TERMINATE", "provisioning_model": "STANDARD", "automatic_restart": True}
    if max_run_hours:
        out["max_run_duration"] = {"seconds": max_run_hours * 3600}
        out["instance_termination_action"] = "STOP"
    return out


def desired_status(running: bool) -> str:
    """A stopped VM bills no GPU and no vCPU, and keeps its disk."""
    return "RUNNING" if running else "TERMINATED"


def remote_root(cfg: StackConfig) -> str:
    """REMOTE_ROOT for root's startup script: '~/x' is under the login user's home ($HOME_DIR)."""
    return f"$HOME_DIR/{cfg.remote_root[2:]}" if cfg.remote_root.startswith("~/") else cfg.remote_root


def startup_script(cfg: StackConfig, agent_zipapp: bytes) -> str:
    """Runs as root at every boot: install the agent and its systemd units (data/startup-script.sh.in).

    gpu-train-shutdown's ExecStop lets jobs checkpoint when the VM stops or is preempted;
    gpu-train-tick.timer stops an idle VM; gpu-train-boot resumes interrupted runs.
    """
    packed = base64.b64encode(gzip.compress(agent_zipapp, mtime=0)).decode()
    settings = json.dumps({**cfg.agent_settings(), "poweroffCommand": ["systemctl", "poweroff"]})
    script = STARTUP_TEMPLATE.read_text(encoding="utf-8")
    for mark, value in (("@USER@", cfg.ssh_user), ("@ROOT@", remote_root(cfg)), ("@PACKED@", packed),
                        ("@SETTINGS@", settings)):
        script = script.replace(mark, value)
    return script


def metadata(cfg: StackConfig, public_key: str, agent_zipapp: bytes) -> dict[str, str]:
    """Driver on first boot; only our key logs in (project-wide keys blocked, OS Login off);
    the startup script installs the on-host agent at every boot."""
    key = " ".join(public_key.split()[:2])  # type and key, with our user as the comment
    return {
        "install-nvidia-driver": "True",
        "ssh-keys": f"{cfg.ssh_user}:{key} {cfg.ssh_user}",
        "block-project-ssh-keys": "TRUE",
        "enable-oslogin": "FALSE",
        "startup-script": startup_script(cfg, agent_zipapp),
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
