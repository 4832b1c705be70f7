"""Every ``gpu-train:`` stack setting, declared once, as a field of :class:`StackConfig`.

Each field's ``setting(...)`` says the key in the stack file, its kind, its default, what it means
and which targets (``gcp``, ``ssh``) it applies to. Parsing (``config.parse``), the defaults, the
docs/settings.md's table (``readme_table``, checked by a test) and the on-host agent's settings
(``stack.agentdoc.agent_settings``) all come from these fields. A new setting is one field here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from gpu_train.contract import (  # the agent's own defaults, shared with the host
    GCP_REMOTE_ROOT,
    REMOTE_ROOT_DEFAULT,
    AgentSettings,
)
from gpu_train.stack.sshhost import SshHost

if TYPE_CHECKING:
    from gpu_train.catalog.model import Catalog

NAMESPACE = "gpu-train"
GCP, SSH, BOTH = ("gcp",), ("ssh",), ("gcp", "ssh")
KINDS = ("str", "int", "number", "bool", "list", "map", "pools")
MAX_NOTICE_S = 3600  # (no maximum is documented: an hour is gpu-train's own bound)
SOFT_DELETE_HELP = (
    "`true`: keep Cloud Storage's soft delete (7 days) on a bucket the stack creates (off: overwritten checkpoints "
    "and composed parts would bill 7 more days)"
)
AREA_HELP = (
    "this stack's own folder in `bucket`, `STACK@XXXXXXXX`: gpu-train writes it into the stack file once (an SSH "
    "stack's first `train` with a bucket, a GCP stack's `up`); commit it, and give no other stack file the same value"
)
NOTICE_HELP = (
    "spot: Compute Engine marks the VM preempted (metadata `preempted`, the job's `$GPU_TRAIN_NOTICE`) this long "
    f"before the soft-off (`scheduling.preemptionNoticeDuration`; 0: at it, 30 s before the power-off); 1 to {MAX_NOTICE_S}"
)
GCP_IDLE_STOP_MINUTES = 30  # idleStopMinutes on GCP stacks; SSH stacks take the agent's default (off)


@dataclass(frozen=True)
class Setting:
    """One setting: ``gpu-train:KEY`` in a stack file, ``StackConfig.ATTR`` in the code."""

    key: str
    kind: str  # str | int | bool | list | map
    default: Any
    help: str
    targets: tuple[str, ...] = BOTH
    required_for: tuple[str, ...] = ()
    shown_default: str | None = None  # the README's default column, when not the default itself
    # ("catalog.ATTR": the catalog's fact of that name)
    agent: bool = False  # also in the host's agent.json
    attr: str = ""  # filled in from the field's name


def setting(
    key: str,
    kind: str,
    default: Any = None,
    help: str = "",
    *,
    targets: tuple[str, ...] = BOTH,
    required_for: tuple[str, ...] = (),
    shown: str | None = None,
    agent: bool = False,
) -> Any:
    """A StackConfig field that is a stack setting (mutable defaults are copied per instance)."""
    assert kind in KINDS, kind
    if kind == "map":  # a map setting defaults to an empty map, a fresh one per instance
        meta = {"setting": Setting(key, kind, {}, help, targets, required_for, shown, agent)}
        return field(default_factory=dict, metadata=meta)
    assert not isinstance(default, (dict, list)), f"{key}: an immutable default, please"
    return field(default=default, metadata={"setting": Setting(key, kind, default, help, targets, required_for, shown, agent)})


@dataclass(frozen=True)
class StackConfig:
    """Every ``gpu-train:`` setting of one stack, typed, with defaults applied (``config.parse`` builds it)."""

    stack: str
    project: str | None = None  # gcp:project, Pulumi's own setting
    # The settings as given (before defaults), for messages and "was it set?" questions.
    given: frozenset[str] = frozenset()

    zone: str = setting(
        "zone",
        "str",
        "",
        "zone, e.g. `us-central1-a` (or an AI zone such as `us-central1-ai1`); the region is derived",
        targets=GCP,
        required_for=GCP,
        shown="required",
    )
    machine_type: str = setting(
        "machineType",
        "str",
        "n1-standard-8",
        "an N1 type with attached GPUs, or a GPU shape (`g2-standard-8`, `a2-highgpu-1g`, `a3-highgpu-1g`, ...)",
        targets=GCP,
    )
    gpu_type: str | None = setting(
        "gpuType", "str", None, "e.g. `nvidia-tesla-t4`; implied by GPU shapes (checked when given)", targets=GCP, shown="required for N1"
    )
    gpu_count: int | None = setting(
        "gpuCount", "int", None, "GPUs per VM; implied by GPU shapes (checked when given)", targets=GCP, shown="required for N1"
    )
    spot: bool = setting(
        "spot", "bool", False, "Spot VM: cheaper (Google: up to 91% off; spot prices may change daily), may be preempted", targets=GCP
    )
    flex_start: bool = setting(
        "flexStart",
        "bool",
        False,
        "Flex-start VM (Dynamic Workload Scheduler): A2, G2, A3, A4 "
        "(not G4, not A4X); needs `maxRunHours` (10 min to 7 days); not with `spot`",
        targets=GCP,
    )
    reservation: str | None = setting(
        "reservation",
        "str",
        None,
        "consume this reservation: `NAME`, "
        "`projects/P/reservations/NAME` or `.../reservationBlocks/B` (never created "
        "or deleted by the stack); not with `spot` or `flexStart`",
        targets=GCP,
        shown="none",
    )
    reservation_bound: bool = setting(
        "reservationBound",
        "bool",
        False,
        "the reservation is DENSE (calendar mode, future reservations: most A4 and A3 Ultra capacity): the VM is "
        "`RESERVATION_BOUND` (restarts itself after maintenance, ends with the reservation; not with `maxRunHours`); "
        "`scripts/preflight` refuses a DENSE one without it",
        targets=GCP,
    )
    provisioning_fallback: tuple[str, ...] = setting(
        "provisioningFallback",
        "list",
        (),
        "`scripts/up`: other ways to try, in order, when the stack's own finds no capacity in a zone: `spot`, `flex-start`, `on-demand`",
        targets=GCP,
        shown="`[]`",
    )
    boot_disk_size_gb: int = setting("bootDiskSizeGb", "int", 200, "boot disk size (checked against the image's size at `up`)", targets=GCP)
    boot_disk_type: str = setting(
        "bootDiskType",
        "str",
        "pd-balanced",
        "boot disk type: `pd-balanced` on N1, G2, "
        "A2, A3 High/Mega/Edge; `hyperdisk-balanced` on A4, A3 Ultra, A4X, G4 (Hyperdisk "
        "only); a type the series does not take is refused (catalog `disks` table)",
        targets=GCP,
        shown="the series' own",
    )
    data_disk_size_gb: int = setting(
        "dataDiskSizeGb", "int", 100, "each node's data disk (`REMOTE_ROOT/runs`); outlives the VM", targets=GCP
    )
    data_disk_type: str | None = setting(
        "dataDiskType",
        "str",
        None,
        "data disk type; a type the series does not take as a data disk is refused",
        targets=GCP,
        shown="the series' own",
    )
    image_family: str | None = setting(
        "imageFamily",
        "str",
        None,
        "Deep Learning VM family (the catalog's current PyTorch one)",
        targets=GCP,
        shown="catalog.default_image_family",
    )
    image_project: str | None = setting("imageProject", "str", None, "image project", targets=GCP, shown="catalog.image_project")
    network: str = setting("network", "str", "default", "the VPC network of the VM and its firewall rules", targets=GCP)
    ssh_user: str = setting("sshUser", "str", "trainer", "login user created on the VM", targets=GCP)
    ssh_public_key: str = setting("sshPublicKey", "str", "~/.ssh/id_ed25519.pub", "your public key, or a path to it", targets=GCP)
    ssh_source_ranges: tuple[str, ...] = setting(
        "sshSourceRanges",
        "list",
        (),
        "CIDRs allowed to SSH; `0.0.0.0/0` and `::/0` refused unless `allowSshFromAnywhere`",
        targets=GCP,
        required_for=GCP,
        shown="required",
    )
    allow_ssh_from_anywhere: bool = setting("allowSshFromAnywhere", "bool", False, "`true`: world-open SSH on purpose", targets=GCP)
    labels: dict[str, str] = setting("labels", "map", help="extra labels on the VM", targets=GCP)
    target: str = setting("target", "str", "gcp", "`ssh` for hosts you already have (see below)")
    hosts: tuple[SshHost, ...] = setting(
        "hosts",
        "list",
        (),
        "`user@host:port` of each host, or a `Host` alias of your ssh_config",
        targets=SSH,
        required_for=SSH,
        shown="required for `ssh`",
    )
    ssh_key: str | None = setting(
        "sshKey",
        "str",
        None,
        "private key used to log in (a passphrase key: `ssh-add` it)",
        shown="GCP: public key's path minus `.pub`; SSH: ssh-agent and the ssh_config's `IdentityFile`s",
    )
    ssh_config: str | None = setting(
        "sshConfig",
        "str",
        None,
        "an ssh_config file for host aliases, `User`, `Port`, `IdentityFile`, `ProxyJump`",
        targets=SSH,
        shown="`~/.ssh/config`",
    )
    known_hosts: str | None = setting("knownHosts", "str", None, "a known_hosts file pinning host keys", shown="learned on first contact")
    remote_root: str = setting(
        "remoteRoot",
        "str",
        REMOTE_ROOT_DEFAULT,
        "where gpu-train keeps its files on a host (`{node}` is replaced by the node's number)",
        shown=f"`{REMOTE_ROOT_DEFAULT}` (an SSH host with runs in `{GCP_REMOTE_ROOT}`, the "
        f"old default, keeps that); GCP: `{GCP_REMOTE_ROOT}` (the data disk)",
    )
    python: str | None = setting(
        "python",
        "str",
        None,
        "Python on the host; detected: the first candidate that imports torch (`/opt/conda/bin/python`, ..., `python3` on PATH)",
        shown="detected",
    )
    image: str | None = setting(
        "image",
        "str",
        None,
        "a container image each run uses unless `train --image` names another (`--image none`: on the host); "
        "GCP: pulled at boot, readable by the VM where it is in Artifact Registry (see docs/containers.md)",
        shown="none",
    )
    venv: bool = setting(
        "venv",
        "bool",
        True,
        "run jobs in a virtual environment per project "
        "(`REMOTE_ROOT/envs/PROJECT_ID`: the project's id) made from `python` with its site packages; `false` "
        "installs `requirements.txt` into `python` itself",
        shown="`true` on SSH stacks, `false` on GCP",
    )
    idle_stop_minutes: float = setting(
        "idleStopMinutes",
        "number",
        AgentSettings.idle_stop_minutes,
        "power off after this many idle minutes (fractions allowed); `0` = off",
        shown=f"`{GCP_IDLE_STOP_MINUTES}` on GCP, `{AgentSettings.idle_stop_minutes}` on SSH stacks",
        agent=True,
    )
    preemption_notice_s: int = setting("preemptionNoticeSeconds", "int", 0, NOTICE_HELP, targets=GCP)
    max_run_hours: float | None = setting(
        "maxRunHours",
        "number",
        AgentSettings.max_run_hours,
        "hard cap on "
        "the VM's run time in hours from each start (fractions allowed; 1 to 2880; "
        "Flex-start: required, 10 min to 168), then Compute Engine stops it; "
        "the job is warned before",
        targets=GCP,
        agent=True,
    )
    running: bool = setting("running", "bool", True, "`false` stops the VM (disk kept)", targets=GCP)
    max_resumes: int = setting(
        "maxResumes", "int", AgentSettings.max_resumes, "relaunches after reboots/preemptions before a run is marked failed", agent=True
    )
    recover_hours: float = setting(
        "recoverHours",
        "number",
        24,
        "spot and Flex-start stacks: a VM "
        "preempted or stopped by a host error or host maintenance is started again by "
        "a function of the stack's own (scale to zero) for this many hours, then given up "
        "(`0`: no recovery; at most 24, the window Cloud Run functions retry an event in); see docs/recovery.md",
        targets=GCP,
    )
    notify: str | None = setting(
        "notify",
        "str",
        None,
        "a webhook told when a run ends, fails, is preempted, comes "
        "back or is given up (Slack, Discord, ntfy.sh topic); a secret: "
        "`pulumi config set --secret gpu-train:notify URL`",
    )
    bucket: str | None = setting(
        "bucket",
        "str",
        None,
        "Cloud Storage for runs: `NAME` or `gs://NAME/PREFIX`; each "
        "run's JOB_DIR goes to `PREFIX/.gpu-train-runs/AREA/RUN/` while it trains (AREA: `bucketArea`); "
        "no prefix folder may start with `.gpu-train` (see docs/bucket.md)",
        shown="none",
    )
    bucket_area: str | None = setting("bucketArea", "str", None, AREA_HELP, shown="none")
    bucket_create: bool = setting(
        "bucketCreate",
        "bool",
        False,
        "`true`: the stack creates `bucket` in the VM's region (uniform access; kept at `down`); `false`: the bucket exists already",
        targets=GCP,
    )
    bucket_soft_delete: bool = setting("bucketSoftDelete", "bool", False, SOFT_DELETE_HELP, targets=GCP)
    nodes: int = setting(
        "nodes", "int", 1, "VMs of the same shape for multi-node training (GCP; SSH stacks list several `hosts`)", targets=GCP
    )
    quota_request: dict[str, str] = setting(
        "quotaRequest", "map", help="`{gpus, justification, contactEmail}`: request GPU quota from `pulumi up`", targets=GCP, shown="none"
    )
    fallback_shapes: tuple[str, ...] = setting(
        "fallbackShapes", "list", (), "other shapes `scripts/up` may try: `MACHINE` or `MACHINE/GPU/COUNT`", targets=GCP, shown="`[]`"
    )
    spot_fallback: bool = setting("spotFallback", "bool", False, "`scripts/up`: on demand when spot has no capacity anywhere", targets=GCP)
    # gpu_train.stack.pools.Pool, chief first; machineType etc. are then the chief's
    pools: tuple[Any, ...] = setting(
        "pools",
        "pools",
        (),
        "nodes of different shapes in one cluster: `[{role: "
        "chief, worker or ps; count, machineType, gpuType, gpuCount}, ...]` instead of "
        "machineType/gpuType/gpuCount/nodes",
        targets=GCP,
        shown="none",
    )

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0] if self.zone else ""

    @property
    def is_gcp(self) -> bool:
        return self.target == "gcp"

    @property
    def preemptible_quota(self) -> bool:
        """Spot and Flex-start VMs count against the PREEMPTIBLE_ quotas first (Compute Engine docs)."""
        return self.spot or self.flex_start

    def ssh_private_key_path(self) -> str:
        """The private key used to log in: ``sshKey``, else the public key's path minus .pub."""
        if self.ssh_key:
            return self.ssh_key
        if looks_like_key_text(self.ssh_public_key):
            return "~/.ssh/id_ed25519"
        return self.ssh_public_key.removesuffix(".pub")


def looks_like_key_text(value: str) -> bool:
    return value.lstrip().startswith(("ssh-", "ecdsa-", "sk-ssh-", "sk-ecdsa-"))


def _declared() -> tuple[Setting, ...]:
    out = []
    for f in fields(StackConfig):
        if "setting" in f.metadata:
            s = f.metadata["setting"]
            out.append(Setting(**{**s.__dict__, "attr": f.name}))
    return tuple(out)


SETTINGS: tuple[Setting, ...] = _declared()
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}


def shown_default(s: Setting, catalog: Catalog) -> str:
    if s.shown_default is not None and s.shown_default.startswith("catalog."):
        return f"`{getattr(catalog, s.shown_default.removeprefix('catalog.'))}`"
    if s.shown_default is not None:
        return s.shown_default
    if s.default is None:
        return "none"
    if isinstance(s.default, bool):
        return f"`{str(s.default).lower()}`"
    if isinstance(s.default, (tuple, list)):
        return "`[]`" if not s.default else f"`{list(s.default)}`"
    return f"`{s.default}`"


def readme_table(catalog: Catalog) -> str:
    """The README's settings table (between its `settings-table` markers); defaults that are catalog
    facts are shown from ``catalog``."""
    rows = ["| key | default | meaning |", "|---|---|---|", "| `gcp:project` | required | the Google Cloud project |"]
    rows += [f"| `{s.key}` | {shown_default(s, catalog)} | {s.help} |" for s in SETTINGS]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # print the README's table
    from gpu_train.catalog.loader import load_catalog

    print(readme_table(load_catalog()), end="")
