"""The stack-config model: one typed object read from a Pulumi stack's ``gpu-train:`` settings.

The same model serves the Pulumi program (values come from the engine as strings, structured
values as JSON), ``scripts/plan`` and the ``fab`` tasks (values come from the stack file as YAML).
``parse`` turns either form into a :class:`StackConfig` or raises :class:`ConfigError` with every
problem at once. It checks presence and types only; the GPU rules live in ``validate``.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpu_train.containerspec import IMAGE_REF_PATTERN
from gpu_train.contract import GCP_REMOTE_ROOT
from gpu_train.stack.bucket import area_problems, bucket_problems
from gpu_train.stack.pools import parse_pools
from gpu_train.stack.problems import ConfigError, Problem, shown
from gpu_train.stack.settings import (  # each setting is declared once, there
    BY_KEY,
    GCP_IDLE_STOP_MINUTES,
    NAMESPACE,
    StackConfig,
)
from gpu_train.stack.sshhost import SshHost

if TYPE_CHECKING:  # (the Compute Engine modules load only for a GCP stack: an SSH stack's tasks never need them)
    from gpu_train.catalog.model import Catalog

SECRET_SETTINGS = ("notify",)  # may be stored encrypted (`pulumi config set --secret`)
SECRET_VALUE = "(secret)"  # such a setting's value where it is not decrypted

_TYPE_WORDS = {
    "str": "a string",
    "int": "a whole number",
    "number": "a number",
    "bool": "true or false",
    "list": "a list of strings",
    "map": "a map of strings to strings",
    "pools": "a list of pools ({role, count, machineType, gpuType, gpuCount})",
}


def parse_shape(text: str) -> tuple[str, str | None, int | None]:
    """A fallback shape, ``MACHINE`` or ``MACHINE/GPU/COUNT`` (COUNT defaults to 1): (machine, gpu, count).

    Raises ValueError when COUNT is not a whole number.
    """
    machine, _, rest = text.partition("/")
    gpu, _, count = rest.partition("/")
    if count and not count.isdigit():
        raise ValueError(text)
    return machine, gpu or None, int(count) if count else (1 if gpu else None)


# -- coercion: one function per kind, each returning (value, error message) ------------------
def _maybe_json(raw: Any) -> Any:
    if isinstance(raw, str) and raw.strip()[:1] in "[{":
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def _as_str(raw: Any) -> Any:
    if isinstance(raw, str) and raw.strip():
        return raw.strip()
    raise TypeError


def _as_int(raw: Any) -> int:
    if isinstance(raw, bool):
        raise TypeError
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        return int(raw)
    raise TypeError


def _as_number(raw: Any) -> float | int:
    if isinstance(raw, bool):
        raise TypeError
    if isinstance(raw, int):
        return raw
    if isinstance(raw, (float, str)):
        try:
            value = float(raw)
        except ValueError:
            raise TypeError from None
        if not math.isfinite(value):
            raise TypeError
        return int(value) if value.is_integer() else value
    raise TypeError


def _as_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise TypeError


def _as_list(raw: Any) -> tuple[str, ...]:
    raw = _maybe_json(raw)
    if isinstance(raw, str):  # `pulumi config set k "a,b"` gives one comma-separated string
        raw = [part.strip() for part in raw.split(",") if part.strip()]
    if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        return tuple(x.strip() for x in raw)
    raise TypeError


def _as_map(raw: Any) -> dict[str, str]:
    raw = _maybe_json(raw)
    scalar = (str, int, float)
    if isinstance(raw, dict) and all(isinstance(k, str) and isinstance(v, scalar) and not isinstance(v, bool) for k, v in raw.items()):
        return {k: str(v) for k, v in raw.items()}
    raise TypeError


def _as_pools(raw: Any) -> list[Any]:
    raw = _maybe_json(raw)
    if isinstance(raw, list) and all(isinstance(x, dict) for x in raw):
        return raw
    raise TypeError


_COERCE: dict[str, Callable[[Any], Any]] = {
    "str": _as_str, "int": _as_int, "number": _as_number, "bool": _as_bool, "list": _as_list, "map": _as_map, "pools": _as_pools,
}  # fmt: skip


def split_host(text: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` (IPv6 as ``[::1]:22``) into (user or None, host, port or None)."""
    user, _, hostport = text.strip().rpartition("@")
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest.removeprefix(":")
    elif hostport.count(":") == 1:
        host, port = hostport.split(":")
    else:
        host, port = hostport, ""
    if not host or (port and not (port.isdigit() and 0 < int(port) < 65536)):
        raise ValueError(text)
    return user or None, host, int(port) if port else None


def parse_host(text: str) -> SshHost:
    """``user@host:port`` (user and port optional: current user, 22; the ssh_config may say
    otherwise, see remote/ssh/config.py); ``host`` may be a Host alias."""
    user, host, port = split_host(text)
    return SshHost(user or os.environ.get("USER") or "root", host, port or 22, spec=text.strip())


def _normalise_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """Bare keys belong to the project's namespace, as in Pulumi's own stack files."""
    return {(k if ":" in k else f"{NAMESPACE}:{k}"): v for k, v in raw.items()}


def parse(raw: dict[str, Any], stack: str, catalog: Catalog) -> StackConfig:
    """Type-check a stack's raw settings and apply defaults; raise ConfigError listing all problems.

    ``catalog`` gives the defaults that are catalog facts (the caller loads it: see gpu_train/catalog/loader.py)."""
    cfg, problems = parse_partial(raw, stack, catalog)
    if problems:
        raise ConfigError(problems, stack)
    return cfg


def parse_partial(raw: dict[str, Any], stack: str, catalog: Catalog | None) -> tuple[StackConfig, list[Problem]]:
    """The config built from the settings that parsed (defaults elsewhere), and the problems.

    Lets callers run the GPU rules on what did parse, so a user sees every problem at once. An SSH
    stack needs no ``catalog`` (None: gpu_train/stack/check.py): its settings name no Compute Engine shape.
    """
    raw = _normalise_keys(raw)
    problems: list[Problem] = []
    values: dict[str, Any] = {}
    for full_key, value in raw.items():
        ns, _, name = full_key.partition(":")
        if ns != NAMESPACE:
            continue
        key = BY_KEY.get(name)
        if key is None:
            close = difflib.get_close_matches(name, BY_KEY, n=1, cutoff=0.6)
            fix = f"did you mean '{NAMESPACE}:{close[0]}'?" if close else f"known keys: {', '.join(sorted(BY_KEY))}"
            problems.append(Problem(name, "unknown setting", fix, value))
            continue
        if isinstance(value, dict) and set(value) == {"secure"} and name in SECRET_SETTINGS:
            values[name] = SECRET_VALUE  # Pulumi decrypts it for the program; the laptop asks `pulumi config get`
            continue
        if isinstance(value, dict) and set(value) == {"secure"}:
            problems.append(
                Problem(
                    name,
                    "is stored as a secret, which gpu-train cannot use here",
                    f"set it in plain text: pulumi config set {NAMESPACE}:{name} VALUE",
                )
            )
            continue
        try:
            values[name] = _COERCE[key.kind](value)
        except TypeError:
            problems.append(
                Problem(
                    name, f"expected {_TYPE_WORDS[key.kind]}, got {type(value).__name__}", f"set {name} to {_TYPE_WORDS[key.kind]}", value
                )
            )

    target = values.get("target", "gcp")
    known = target in ("gcp", "ssh")  # else which settings apply, and which are required, is unknown: not judged
    if not known:
        close = difflib.get_close_matches(str(target).lower(), ["ssh", "gcp"], n=1, cutoff=0.5)
        guess = f"did you mean '{close[0]}'? " if close else ""
        problems.append(Problem("target", "must be 'gcp' or 'ssh'", f"{guess}set {NAMESPACE}:target to gcp or ssh", target))
        target = "gcp"
    for name in values if known else ():
        if target not in BY_KEY[name].targets:
            problems.append(
                Problem(name, f"does not apply to a target '{target}' stack", f"remove {NAMESPACE}:{name} from the stack", values[name])
            )
    for key in BY_KEY.values() if known else ():
        if target in key.required_for and key.key not in values and not any(p.key == key.key for p in problems):
            problems.append(Problem(key.key, "is required", f"pulumi config set {NAMESPACE}:{key.key} ... ({key.help})"))

    hosts: list[SshHost] = []
    for text in values.get("hosts", ()):
        try:
            hosts.append(parse_host(text))
        except ValueError:
            problems.append(Problem("hosts", f"{shown(text)} is not user@host:port", "write each host as user@host:port"))

    project = raw.get("gcp:project")
    if known and target == "gcp" and not (isinstance(project, str) and project.strip()):
        problems.append(Problem("gcp:project", "is required", "pulumi config set gcp:project YOUR_PROJECT_ID"))

    if not any(p.key in ("bucket", "bucketCreate") for p in problems):
        problems += bucket_problems(values.get("bucket"), bool(values.get("bucketCreate")))
    problems += area_problems(values.get("bucketArea"))
    if isinstance(values.get("image"), str) and not re.fullmatch(IMAGE_REF_PATTERN, values["image"]):
        fix = "write REGISTRY/NAME:TAG or NAME@sha256:DIGEST, lowercase (e.g. nvcr.io/nvidia/pytorch:24.05-py3)"
        problems.append(Problem("image", "is not an image reference", fix, values["image"]))
    if catalog is None and target == "gcp":
        raise ValueError("a GCP stack is parsed against the catalog (gpu_train/catalog/loader.py load_catalog)")
    if catalog is not None:
        from gpu_train.catalog import gpunames
    if "gpuType" in values and catalog is not None:  # `gpuType: T4` is nvidia-tesla-t4: the program and the API get the API name
        values["gpuType"] = gpunames.api_name(values["gpuType"], catalog)
    kwargs = {BY_KEY[k].attr: v for k, v in values.items() if k != "hosts"}
    if values.get("pools"):
        pools, pool_problems = parse_pools(values["pools"])
        problems += pool_problems
        if catalog is not None:
            pools = tuple(replace(p, gpu_type=gpunames.api_name(p.gpu_type, catalog)) if p.gpu_type else p for p in pools)
        kwargs["pools"] = pools
        if pools:  # the stack's own shape is the chief's; nodes counts every pool
            chief = pools[0]
            kwargs.update(
                machine_type=chief.machine_type, gpu_type=chief.gpu_type, gpu_count=chief.gpu_count, nodes=sum(p.count for p in pools)
            )
    if target == "gcp":  # a VM bills by the minute: it stops itself when idle unless told otherwise
        kwargs.setdefault("idle_stop_minutes", GCP_IDLE_STOP_MINUTES)
    if target == "gcp":  # the Deep Learning VM's framework Python, as it is
        kwargs.setdefault("venv", False)
    if target == "gcp":  # where the VM's startup script binds the data disk (contract.GCP_REMOTE_ROOT says why)
        kwargs.setdefault("remote_root", GCP_REMOTE_ROOT)
    if catalog is not None and target == "gcp":  # image and disk defaults are catalog facts
        from gpu_train.catalog.disks import default_disk_type

        kwargs.setdefault("image_family", catalog.default_image_family)
        kwargs.setdefault("image_project", catalog.image_project)
        kwargs.setdefault("boot_disk_type", default_disk_type(catalog, kwargs.get("machine_type", BY_KEY["machineType"].default)))
    cfg = StackConfig(
        stack=stack,
        project=project.strip() if isinstance(project, str) else None,
        hosts=tuple(hosts),
        given=frozenset(values),
        **kwargs,
    )
    return cfg, problems
