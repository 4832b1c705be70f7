"""What a start left on every node: a launch's or a sweep's start whose answer was lost with its connection,
asked of the host by the id the laptop chose (`launch-outcome`, agent/outcome.py), and a cluster's start
that ends with every node started or none.

The host's answer is final: it started (its answer, as if nothing had happened) or never will. Only a host
that cannot be asked again is left open (``Unsettled``); on a cluster it is stopped with the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from gpu_train.errors import GpuTrainError, Unreachable
from remote.tasks.session import CLI, Session, failures, nodes_failed, on_every_node, say

if TYPE_CHECKING:
    from gpu_train.answers import Launched, SweepStarted
    from remote.errors import RemoteError

T = TypeVar("T")


class Unsettled(Unreachable):
    """A node whose start's answer was lost with its connection, and the host could not be asked again:
    whether it started is unknown (a cluster's other nodes are stopped, and it is tried too)."""


def launch_outcome(session: Session, run: str, lost: RemoteError) -> Launched:
    """The answer the launch of ``run`` lost with its connection (``lost``), from the host itself, asked by
    the run's id over a new connection: the run started there (said), or it did not and now never will (a
    GpuTrainError saying so); Unsettled where the host cannot be asked."""
    from gpu_train.answers import Launched
    from remote.ssh.agentcall import checked

    said = _asked(session, run, run, lost, f"`{CLI} status --run {run}` says, `{CLI} stop --run {run}` stops it")
    return checked(Launched, said, f"{session.target.host}'s launch-outcome answer")


def sweep_outcome(session: Session, sweep: str, staged: str, lost: RemoteError) -> SweepStarted:
    """As ``launch_outcome``, for the start of sweep ``sweep`` whose code was staged as ``staged``: the host
    says whether it kept the sweep (its queue then moves by itself) and which trials started."""
    from gpu_train.answers import SweepStarted
    from remote.ssh.agentcall import checked

    said = _asked(
        session,
        staged,
        f"sweep {sweep}",
        lost,
        f"`{CLI} sweep status --sweep {sweep}` says, `{CLI} sweep stop --sweep {sweep}` stops it",
        "--sweep",
        sweep,
    )
    return checked(SweepStarted, said, f"{session.target.host}'s launch-outcome answer")


def _asked(session: Session, run: str, what: str, lost: RemoteError, look: str, *more: str) -> Any:
    """`launch-outcome --run RUN [MORE]` over a new connection: what the start answered, or a GpuTrainError
    saying why it never will start; Unsettled (with ``look``: how to see and stop it) where it cannot be asked."""
    say(f"{lost}; connecting again to ask whether {what} started")
    try:
        session.reconnect()
        outcome = session.call("launch-outcome", "--run", run, *more)
    except GpuTrainError as e:
        raise Unsettled(f"{lost}, and asking again failed ({e}): {what} may be running there; {look}") from None
    if outcome["launched"] is None:
        raise GpuTrainError(f"{lost}; {what} did not start there ({outcome['reason']})")
    say(f"{session.target.host}: connected again: {what} had started")
    return outcome["launched"]


def all_or_none(sessions: list[Session], answers: Sequence[T | GpuTrainError], stop: Callable[[Session], object], what: str) -> list[T]:
    """Every node's answer to a start; where a node failed, ``what`` is stopped (``stop``) on the nodes that
    started it, and on a cluster on those that may have (Unsettled): no half a cluster, and the failures
    are raised as one error (``nodes_failed``: their exit status where they share one)."""
    if not failures(answers):
        return [a for a in answers if not isinstance(a, GpuTrainError)]
    several = len(sessions) > 1
    started = [
        s for s, a in zip(sessions, answers, strict=True) if not isinstance(a, GpuTrainError) or (several and isinstance(a, Unsettled))
    ]
    stopped = on_every_node(started, stop)
    told = [s.node for s, a in zip(started, stopped, strict=True) if not isinstance(a, GpuTrainError)]
    nodes = ", ".join(str(n) for n in told)
    raise nodes_failed(answers, f"; {what} was stopped on node {nodes} (no half a cluster)" if several and told else "")
