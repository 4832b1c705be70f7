"""`fetch` from the stack's gpu-train:bucket: on request (`--from bucket`), or when a host cannot be reached
(the whole fetch, or the nodes of `--all-nodes` that do not answer): the bucket holds each run as the
laptop's runs/STACK/RUN/ (node N's files in node-N/)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from gpu_train.environment import Environment
from gpu_train.errors import ExitStatus, GpuTrainError, UsageError, outcome
from remote.tasks import trust
from remote.tasks.session import CLI, Session, say

if TYPE_CHECKING:
    from remote.ssh.target import Target


def destination(env: Environment, stack: str, run: str, dest: str | None, several: bool, subdir: str = "") -> Path:
    """Where a run's JOB_DIR goes: --dest (RUN/ under it for several runs), else the project's runs/STACK/RUN."""
    where = Path(dest) / run if dest and several else Path(dest or env.project_root / "runs" / stack / run)
    return where / subdir if subdir else where


def node_dir(node: int) -> str:
    """Where a node's runs go inside each run's folder: node 0 at the top, node N in node-N/."""
    return f"node-{node}" if node else ""


def areas_of(target: Target) -> list[str]:
    """The folders of the bucket a stack's runs may be in, its own first: its area, and where it has one, its
    name's folder from before areas (runs uploaded then stay there, and resume there: the host's spec names it)."""
    from gpu_train.stack.bucket import area_of

    return [area_of(target.stack, target.bucket_area), *([target.stack] if target.bucket_area else [])]


def from_bucket(
    env: Environment, target: Target, run: str | None, all_: bool, dest: str | None, streams: int, node: int | None = None
) -> None:
    """`fetch --from bucket`: the newest run (or --run, or --all) from gs://NAME/PREFIX/.gpu-train-runs/AREA/ (and the
    stack's folder from before areas) into runs/STACK/RUN (``node``: that node's files only, into its folder there: a
    node that cannot be reached)."""
    from gpu_train.stack.bucket import AREA_KEY, parse_bucket, run_prefix, stack_prefix
    from remote.errors import RemoteError
    from remote.transfer import bucketfetch

    if not target.bucket:
        raise UsageError(f"stack {target.stack} has no bucket: set gpu-train:bucket (see docs/bucket.md), or fetch from the host")
    place = parse_bucket(target.bucket)
    areas = areas_of(target)
    shown = " and ".join(place.url(stack_prefix(place, a)[len(place.prefix) :]) for a in areas)
    try:
        gcs = bucketfetch.client()
        where: dict[str, str] = {}  # run -> its area (the stack's own wins)
        for area in reversed(areas):
            found, odd = bucketfetch.runs_in(gcs, place, area)
            where.update(dict.fromkeys(found, area))
            if odd:
                folder = place.url(stack_prefix(place, area)[len(place.prefix) :])
                say(f"not run ids, left alone: {', '.join(repr(n[:80]) for n in odd[:5])} in {folder}")
        runs = sorted(where, key=bucketfetch.run_order)
        if run:
            runs = [r for r in runs if r == run] or [r for r in runs if r.startswith(f"{run}_")][-1:]
        elif not all_:
            runs = runs[-1:]
        if not runs:
            others = [a for a in bucketfetch.areas_named(gcs, place, target.stack) if a not in areas]
            hint = (
                f"; other stacks named {target.stack} have runs in {', '.join(others[:5])}: if one is this stack's (its stack "
                f"file lost gpu-train:{AREA_KEY}), put that line back"
                if others
                else ""
            )
            raise GpuTrainError(f"no run{' ' + run if run else 's'} of stack {target.stack} in {shown}{hint}")
        base = Path(dest) if dest else env.project_root / "runs" / target.stack
        failed = []
        for r in runs:
            here = trust.inside(destination(env, target.stack, r, dest, len(runs) > 1, node_dir(node or 0)), base)
            try:
                got = bucketfetch.fetch_run(gcs, place, where[r], r, here, streams, say, node)
            except RemoteError as e:
                if node is None:
                    raise
                failed.append(r)
                say(f"{r}: {e}")
                continue
            for problem in got.problems:
                say(f"{r}: {problem}")
            failed += [r] if got.problems else []
            source = place.url(run_prefix(place, where[r], r, node or 0)[len(place.prefix) :])
            say(f"{r}: {got.files} file(s), {got.bytes} bytes from {source} into {here} (verified; {got.unchanged} unchanged)")
    except RemoteError as e:
        raise GpuTrainError(str(e)) from None
    if failed:
        raise GpuTrainError(f"fetch from the bucket failed for {', '.join(failed)}: run `{CLI} fetch --from bucket` again")


def gone_nodes(
    session: Session, sessions: list[Session], results: list[object], run: str | None, all_: bool, dest: str | None, streams: int
) -> list[object]:
    """--all-nodes where some nodes cannot be reached (all of them: the caller's fallback): those nodes'
    files from the bucket (its RUN/node-N/), the same runs the others answered with. The results, those
    nodes' failures taken out where the bucket served them."""
    gone = [s.node for s, r in zip(sessions, results, strict=True) if isinstance(r, GpuTrainError) and r.status == ExitStatus.UNREACHABLE]
    if not gone or not session.cluster.bucket:
        return results
    if len(gone) == len(sessions):
        raise cast(GpuTrainError, results[0])  # not one node answered: the whole runs from the bucket (the caller)
    answered = sorted({x["id"] for r in results if isinstance(r, tuple) for x in r[0]})
    out = list(results)
    for n in gone:
        say(
            f"node {n}: {outcome(cast(GpuTrainError, results[n]))[1]}\nnode {n} cannot be reached: fetching its files from the bucket "
            f"{session.cluster.bucket} instead"
        )
        try:
            for r in answered:  # (one run each, into where the host's fetch put it: --dest/RUN for several)
                from_bucket(
                    session.env, session.cluster, r, False, str(Path(dest) / r) if dest and len(answered) > 1 else dest, streams, node=n
                )
        except GpuTrainError as e:
            out[n] = GpuTrainError(f"not from the bucket either: {outcome(e)[1]}")
            continue
        out[n] = ([], [])
    return out
