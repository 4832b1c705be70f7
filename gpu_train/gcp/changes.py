"""What a `pulumi up` would do to a deployed stack, field by field, before it does it (pure decisions).

The wanted inputs come from the program run under mocks (``scripts/plan``), the deployed ones from
`pulumi stack export`. Each differing input is judged by ONE table, ``data/replace-fields.yaml``
(the provider's replace-only fields, with its sources): updated in place, restarts the VM, or
replaces it. The data disk is a resource of its own, so replacing the VM keeps it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RULES_PATH = Path(__file__).parent.parent / "data" / "replace-fields.yaml"
INSTANCE, DISK = "gcp:compute/instance:Instance", "gcp:compute/disk:Disk"

# Effects, mildest first: the order is their severity.
IN_PLACE, RESTART, ADD, REPLACE, DELETE, REPLACE_DISK = (
    "in place", "restarts the VM", "adds a VM", "replaces the VM (data disk kept)", "deletes a VM",
    "replaces the data disk (its runs are lost)")  # fmt: skip
SEVERITY = (IN_PLACE, RESTART, ADD, REPLACE, DELETE, REPLACE_DISK)

# Which setting drives an input, for the reader (longest matching path wins; by resource type).
_SETTINGS = {
    INSTANCE: {
        "zone": "zone", "machineType": "machineType", "guestAccelerators": "gpuType/gpuCount",
        "bootDisk.initializeParams.size": "bootDiskSizeGb", "bootDisk.initializeParams.type": "bootDiskType",
        "bootDisk.initializeParams.image": "imageFamily/imageProject", "scheduling": "spot",
        "scheduling.maxRunDuration": "maxRunHours", "scheduling.onInstanceStopAction": "maxRunHours",
        "scheduling.provisioningModel": "spot/flexStart/reservationBound", "reservationAffinity": "reservation",
        "desiredStatus": "running", "networkInterfaces": "machineType",
        "resourcePolicies": "nodes", "metadata": "the startup script (sshUser, sshPublicKey, agent settings)",
        "metadata.ssh-keys": "sshUser/sshPublicKey", "labels": "labels", "attachedDisks": "the data disk",
    },
    DISK: {"size": "dataDiskSizeGb", "type": "dataDiskType", "zone": "zone", "name": "the stack's name"},
}  # fmt: skip


@dataclass(frozen=True)
class Change:
    resource: str  # the logical name (`gpu`, `gpu-0-data`, ...)
    typ: str
    path: str  # "" when the whole resource comes or goes
    old: Any
    new: Any
    effect: str

    @property
    def setting(self) -> str:
        table = _SETTINGS.get(self.typ, {})
        key = _longest_prefix(_strip_indices(self.path), table)
        return table[key] if key is not None else ""


@functools.lru_cache(maxsize=2)
def load_rules(path: Path = RULES_PATH) -> dict[str, dict[str, str]]:
    """The replace-only table: {resource type: {input path: in-place | restart | replace | grow-in-place}}."""
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    if not doc.get("sources") or not doc.get("date"):
        raise ValueError(f"{path}: the table must name its sources and date")
    kinds = {"in-place", "restart", "replace", "grow-in-place"}
    for typ, rows in doc["resources"].items():
        for field, kind in rows.items():
            if kind not in kinds:
                raise ValueError(f"{path}: {typ}.{field}: {kind!r} is not one of {sorted(kinds)}")
    return {typ: {str(k): v for k, v in rows.items()} for typ, rows in doc["resources"].items()}


def _longest_prefix(path: str, table: dict[str, Any]) -> str | None:
    best = None
    for key in table:
        matches = key == "" or path == key or path.startswith(key + ".")
        if matches and (best is None or len(key) > len(best)):
            best = key
    return best


def effect_of(typ: str, path: str, old: Any, new: Any, rules: dict[str, dict[str, str]]) -> str:
    """The effect of changing one input (``path`` without list indices) from ``old`` to ``new``,
    by the replace-only table ``rules`` (``load_rules``: the caller reads it)."""
    rows = rules.get(typ, {})
    key = _longest_prefix(path, rows)
    kind = rows[key] if key is not None else "replace"  # unknown: assume the worst the provider may do
    if kind == "grow-in-place":
        grows = isinstance(old, (int, float)) and isinstance(new, (int, float)) and new >= old
        kind = "in-place" if grows else "replace"
    if typ == DISK:
        return REPLACE_DISK if kind == "replace" else IN_PLACE
    if typ == INSTANCE:
        return {"in-place": IN_PLACE, "restart": RESTART, "replace": REPLACE}[kind]
    return IN_PLACE if kind == "in-place" else RESTART  # e.g. a placement policy: its VMs are stopped to move


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{'a.b[0].c': leaf}: empty values and the provider's filled-in defaults (``__defaults``) left out."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        defaults = set(value.get("__defaults") or ())
        for k, v in value.items():
            if k.startswith("__") or k in defaults:
                continue
            out |= flatten(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out |= flatten(v, f"{prefix}[{i}]")
    elif value not in (None, "") and value != [] and value != {}:
        out[prefix] = int(value) if isinstance(value, float) and value.is_integer() else value
    return out


def _strip_indices(path: str) -> str:
    """'guestAccelerators[0].count' -> 'guestAccelerators.count': the table's rows name fields, not items."""
    return ".".join(part.split("[")[0] for part in path.split("."))


def compare(
    wanted: dict[tuple[str, str], dict[str, Any]],
    deployed: dict[tuple[str, str], dict[str, Any]],
    rules: dict[str, dict[str, str]],
    ignored: dict[str, tuple[str, ...]] | None = None,
) -> list[Change]:
    """Every difference between wanted and deployed inputs, keyed by (type, logical name).

    ``ignored``: inputs the program tells Pulumi to ignore (``ignore_changes``), by resource type.
    Only VM-related resources (instances, disks, placement policies) are judged; the rest
    (firewall, service account, quota preferences) never touch the VM or its data.
    """
    changes: list[Change] = []
    for key in sorted(set(wanted) | set(deployed)):
        typ, name = key
        if typ not in rules:
            continue
        if key not in deployed:
            changes.append(Change(name, typ, "", None, "created", ADD if typ == INSTANCE else IN_PLACE))
            continue
        if key not in wanted:
            changes.append(Change(name, typ, "", "exists", None, {INSTANCE: DELETE, DISK: REPLACE_DISK}.get(typ, RESTART)))
            continue
        skip = [s.replace('["', ".").replace('"]', "") for s in (ignored or {}).get(typ, ())]  # Pulumi's paths, dotted
        new, old = flatten(wanted[key]), flatten(deployed[key])
        for path in sorted(set(new) | set(old)):
            bare = _strip_indices(path)
            if any(bare == s or bare.startswith(s + ".") for s in skip) or new.get(path) == old.get(path):
                continue
            changes.append(Change(name, typ, path, old.get(path), new.get(path), effect_of(typ, bare, old.get(path), new.get(path), rules)))
    return changes


def worst(changes: list[Change]) -> str | None:
    return max((c.effect for c in changes), key=SEVERITY.index, default=None)


def replaces_anything(changes: list[Change]) -> bool:
    """Does applying these changes delete a VM or a data disk (the ones `scripts/up` asks about)?"""
    w = worst(changes)
    return w is not None and SEVERITY.index(w) >= SEVERITY.index(REPLACE)


def _short(value: Any) -> str:
    text = "(none)" if value is None else repr(value)
    return text if len(text) <= 60 else text[:40] + "...(" + str(len(text)) + " chars)"


def render(changes: list[Change], stack: str, cli: str) -> str:
    """The changes, one line each, and what they mean for the runs; ``cli``: the command the user
    runs (gpu-train or fab), for the fixes."""
    if not changes:
        return f"The deployed stack {stack} already matches its settings: `pulumi up` changes nothing on the VM."
    lines = [f"Changes to the deployed stack {stack} (wanted settings vs `pulumi stack export`):"]
    for c in changes:
        what = f"{c.resource} {c.path}" if c.path else c.resource
        why = f" [{c.setting}]" if c.setting else ""
        lines.append(f"  {c.effect:<34} {what}: {_short(c.old)} -> {_short(c.new)}{why}")
    w = worst(changes)
    if w in (REPLACE, DELETE):
        lines.append(
            "A replaced VM gets a new boot disk from the image; REMOTE_ROOT/runs is on the data disk, "
            "which is kept and attached again, and the agent resumes interrupted runs at boot."
        )
    if w == REPLACE_DISK:
        lines.append(
            "A data disk would be deleted: Pulumi refuses (the disk is protected). Fetch its runs "
            f"({cli} fetch --all), then `{cli} down`, or keep the disk's settings (zone, dataDiskType, "
            "a smaller dataDiskSizeGb, nodes) as they are."
        )
    return "\n".join(lines)
