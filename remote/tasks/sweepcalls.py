"""A sweep's agent calls on every node (`sweep-status`, `sweep-stop`), for `sweep`, `stop --sweep` and
`fetch --sweep`: one call per node, the trials' run ids checked before any becomes a path."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from remote.tasks import trust
from remote.tasks.session import Session, every_answer, on_every_node

if TYPE_CHECKING:
    from gpu_train.answers import SweepStatus, SweepStopped, SweepTrial


def sweep_rows(session: Session, name: str | None, metric: str | None, mode: str) -> tuple[list[SweepTrial], SweepStatus]:
    args = ["sweep-status", "--mode", mode] + (["--sweep", name] if name else []) + (["--metric", metric] if metric else [])
    docs = every_answer(on_every_node(session.nodes(), lambda s: s.call("sweep-status", *args[1:])))
    rows = sorted((r for d in docs for r in d["trials"]), key=lambda r: r["index"])
    for r in rows:
        trust.host_run_id(r.get("runId"), session.target.host)
    tags = sorted({t for d in docs for t in d["tags"]})  # (each node's trials logged their own)
    return rows, {**docs[0], "tags": tags}


def stop_node(session: Session, sweep: str, grace: float = 5.0) -> SweepStopped:
    """Sweep ``sweep`` stopped on this node: nothing more starts, the trials at work are stopped."""
    return session.call("sweep-stop", "--sweep", sweep, "--grace", str(float(grace)))


def stop_sweep(session: Session, name: str, as_json: bool, grace: float = 10.0) -> None:
    docs = every_answer(on_every_node(session.nodes(), lambda s: stop_node(s, name, grace)))
    stopped = [r for d in docs for r in d["stopped"]]
    print(json.dumps({"sweep": name, "stopped": stopped}) if as_json else f"sweep {name}: no more trials start; stopped {len(stopped)}")
