"""What the tasks take from a host or a command line before it becomes a path or a number.

A host may lie (compromised, or shared): its documents are checked where they enter (Session.call),
so a run id such as ``../../../x`` never reaches a path on the laptop, and remote paths are rebuilt
from REMOTE_ROOT and the id instead of taken from the host. Options typed by the user become
messages naming the option, not tracebacks.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from gpu_train.errors import GpuTrainError, UsageError
from gpu_train.jobs import JobError, check_run_id
from gpu_train.stack.problems import shown

if TYPE_CHECKING:
    from remote.ssh.target import Target


def host_doc(doc: object, where: object) -> dict[str, Any]:
    """An agent's answer (its strings already printable: agentcall decodes every answer so) whose run
    ids are all run ids; an error otherwise."""
    if not isinstance(doc, dict):
        raise GpuTrainError(f"{where} answered {shown(doc)}, not a gpu-train document: is the agent on it ours?")
    runs = doc.get("runs", [])
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise GpuTrainError(f"{where} answered a run list that is not one ({shown(runs)})")
    for r in runs:
        host_run_id(r.get("id"), where)
    if "runId" in doc:
        host_run_id(doc["runId"], where)
    return doc


def host_run_id(value: object, where: object) -> str:
    try:
        return check_run_id(value, "run id")
    except JobError as e:
        raise GpuTrainError(
            f"{where} answered with a {e}; refusing to use it as a path (the host's gpu-train files may have been tampered with)"
        ) from None


def run_option(value: str | None, option: str = "--run") -> str | None:
    """``--run`` (or ``option``: a sweep's name follows the same rule) as given: None, or a run id (never a path)."""
    if value is None:
        return None
    try:
        return check_run_id(value, option)
    except JobError as e:
        raise UsageError(str(e)) from None


def remote_job_dir(target: Target, run_id: str) -> str:
    """A run's JOB_DIR on the host as rsync names it, from REMOTE_ROOT and a checked id, never from the host."""
    return f"{target.rsync_root()}/runs/{check_run_id(run_id)}/job"


def inside(path: Path, base: Path) -> Path:
    """``path`` resolved, when it lies inside ``base`` (both resolved: a symlink cannot lead out); else an error."""
    resolved, top = path.resolve(), base.resolve()
    if resolved != top and top not in resolved.parents:
        raise GpuTrainError(f"refusing to write {path}: it resolves to {resolved}, outside {top}")
    return resolved


N = TypeVar("N", int, float)


@overload
def number(option: str, value: None, kind: type[N], low: float | None = None, high: float | None = None) -> None: ...
@overload
def number(option: str, value: str | float, kind: type[N], low: float | None = None, high: float | None = None) -> N: ...
@overload
def number(option: str, value: object, kind: type[N], low: float | None = None, high: float | None = None) -> N | None: ...
def number(option: str, value: Any, kind: type[N], low: float | None = None, high: float | None = None) -> N | None:
    """An option's value (as typed: a string, or the task's default) as ``kind`` within [low, high]; None for
    None; a UsageError naming the option otherwise."""
    if value is None:
        return None
    try:
        result = kind(value)
    except (TypeError, ValueError):
        word = "a whole number" if kind is int else "a number"
        raise UsageError(f"{option} {shown(value)}: expected {word}") from None
    if result != result or (low is not None and result < low) or (high is not None and result > high):  # NaN too
        bounds = f"from {low:g}" if low is not None else ""
        bounds += f" to {high:g}" if high is not None else " or more"
        raise UsageError(f"{option} {shown(value)}: must be {bounds.strip()}")
    return result
