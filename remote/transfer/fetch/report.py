"""What a fetch did, per run, and how it is told: the lines of each run and the summary line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_train.errors import printable
from remote.transfer.codesize import human
from remote.transfer.fetch import generator as fp


@dataclass
class RunResult:
    """What one run's fetch did: the counts for the summary line and the reasons it is not complete."""

    run_id: str
    dest: Path
    files: int = 0
    bytes: int = 0
    kept_newer: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)  # links pointing out of the JOB_DIR: not made here
    changed: list[str] = field(default_factory=list)  # changed on the host while being read: next time
    unreadable: list[str] = field(default_factory=list)  # the host could not read them ("PATH (why)")
    unstorable: list[str] = field(default_factory=list)  # names this laptop cannot store ("PATH (why)")
    kept: list[str] = field(default_factory=list)  # replaced here, their previous content kept in ``previous``
    previous: Path | None = None  # where (receiver.previous_dir)
    error: str | None = None
    ssh_exit: int | None = None  # ssh's exit status where ssh's end ended the fetch (255: the host was not reached)
    summary: dict[str, Any] | None = None  # the host's JOB_DIR: files, bytes, newest change (for the fetch record)

    @property
    def unreachable(self) -> bool:
        """Nothing of the run was listed because ssh could not reach the host."""
        return self.ssh_exit == 255 and self.summary is None

    @property
    def up_to_date(self) -> bool:
        return self.complete and self.files == 0

    @property
    def complete(self) -> bool:
        """Everything the host has is home as it should be (a local file newer than the host's aside)."""
        return self.error is None and not (self.changed or self.unreadable or self.unstorable or self.conflicts)

    def missing(self) -> list[str]:
        """What the host has that is not home, each with its reason (empty when complete)."""
        return (
            ([self.error] if self.error is not None else [])
            + [f"unreadable on the host: {p}" for p in self.unreadable]
            + [f"something else is in the way here: {p}" for p in self.conflicts]
            + [f"a name this laptop cannot store: {p}" for p in self.unstorable]
            + [f"changed on the host while being read: {p}" for p in self.changed]
        )


def _some(paths: list[str], limit: int = 5) -> str:
    """A few of the host's file names, each written out (a newline in a name cannot start a line of ours)."""
    return ", ".join(printable(p) for p in paths[:limit]) + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def notes(result: RunResult, where: Path) -> list[str]:
    """What to tell the user about one run's fetch."""
    rid = result.run_id
    if result.error is not None:
        lines = [f"{rid}: fetch failed: {printable(result.error)}"]
    elif result.up_to_date:
        lines = [f"{rid}: up to date in {where}"]
    else:
        lines = [f"{rid}: fetched {result.files} file(s), {human(result.bytes)} -> {where}"]
    if result.kept_newer:
        lines.append(f"  kept {len(result.kept_newer)} local file(s) newer than the host's: {_some(result.kept_newer)}")
    if result.kept:
        lines.append(
            f"  replaced {len(result.kept)} local file(s) whose content differed; the previous content is kept "
            f"in {result.previous}: {_some(result.kept)}"
        )
    if result.conflicts:
        lines.append(f"  NOT fetched, something else is in the way here: {_some(result.conflicts)}")
    if result.unreadable:
        lines.append(f"  NOT fetched, unreadable on the host: {_some(result.unreadable)}")
    if result.unstorable:
        lines.append(f"  NOT fetched, names this laptop cannot store: {_some(result.unstorable)}")
    if result.unsafe:
        lines.append(f"  not made, links pointing out of the run: {_some(result.unsafe)}")
    if result.changed:
        lines.append(f"  NOT fetched, changed on the host while being read (the next fetch takes them): {_some(result.changed)}")
    return lines


def summary_line(results: list[RunResult], elapsed: float, streams: int, runs: int | None = None) -> str:
    """The one line a fetch ends with; ``runs`` runs when each has several results (its JOB_DIR, its
    working directory), in order, the same number each."""
    files, moved = sum(r.files for r in results), sum(r.bytes for r in results)
    runs = runs or len(results)
    k = len(results) // runs
    per = [results[i * k : (i + 1) * k] for i in range(runs)]
    fresh = sum(1 for rs in per if all(r.up_to_date for r in rs))
    failed = sum(1 for rs in per if not all(r.complete for r in rs))
    kept = sum(len(r.kept) for r in results)
    rate = f", {human(moved / elapsed)}/s" if elapsed > 0 and moved else ""
    return (
        f"fetched {files} file(s), {human(moved)} from {runs} run(s) in {elapsed:.1f} s{rate} "
        f"(up to {streams} streams); {fresh} up to date, {failed} not complete"
        + (f"; the previous content of {kept} replaced file(s) kept in .previous/" if kept else "")
    )


def summary(entries: list[fp.Entry]) -> dict[str, Any]:
    files = [e for e in entries if e.kind == "f"]
    return {"files": len(files), "bytes": sum(e.size for e in files), "newestNs": max((e.mtime_ns for e in entries), default=0)}
