"""A task's connections: one node of a stack's target per Session, and fan-out over every node.

Heavy imports (Fabric, paramiko) happen inside the functions so that `fab --list` stays fast.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from gpu_train.environment import CLI as CLI  # (the tasks name it through here too)
from gpu_train.environment import Environment
from gpu_train.errors import GpuTrainError, Unreachable, UsageError, as_error, joined, outcome, printable

if TYPE_CHECKING:
    from gpu_train.answers import (
        Configured,
        LaunchOutcome,
        Pruned,
        Resumed,
        StatusDoc,
        Stopped,
        SweepStarted,
        SweepStatus,
        SweepStopped,
    )
    from remote.ssh.target import Target

STACK_HELP = (
    "stack name (default: $GPU_TRAIN_STACK, else the one `gpu-train stack NAME` selected, else the project's "
    "only stack, else Pulumi's selected stack)"
)
ALL_PROJECTS_HELP = "choose among every project's runs on the host (default: this project's; a run named with --run is always found)"
# How the user called us, for the commands our messages suggest.


def say(text: str) -> None:
    """A notice on stderr; words from a host may be in it, so its control characters are written out."""
    print(printable(text, keep="\n\t"), file=sys.stderr, flush=True)


class Session:
    """One node of a stack's target and one open connection to it, reconnecting on demand."""

    def __init__(
        self,
        env: Environment,
        stack: str | None,
        timeout: float | None = None,
        node: int = 0,
        cluster: Target | None = None,
        probe_shared: bool = False,
    ) -> None:
        from remote.ssh import target as targets

        self.env = env
        if cluster is None:
            cluster = targets.resolve(env, stack)
        if not 0 <= node < len(cluster.hosts):
            raise UsageError(f"--node {node}: the stack has nodes 0 to {len(cluster.hosts) - 1}")
        self._cluster = cluster
        self._target = cluster.for_node(node)  # (read through ``target``)
        self.node = node
        self.timeout = timeout if timeout is not None else (600.0 if self._target.is_gcp else 15.0)
        self.conn: Any = None  # a Fabric Connection, or a MuxConnection over the shared one
        # A task with somewhere else to turn (fetch: the bucket) first makes sure the shared connection still
        # reaches the host: one round trip, instead of hanging on one whose host has vanished.
        self.probe_shared = probe_shared

    @property
    def target(self) -> Target:
        """This node's target. On first contact with an SSH host whose stack sets no remoteRoot, the
        host is asked where gpu-train's files are before anything uses REMOTE_ROOT (which connects)."""
        if self._target.root_unknown and self.conn is None:
            self.connect()
        return self._target

    @property
    def cluster(self) -> Target:
        """The whole stack's target. On first contact with SSH hosts whose stack sets no remoteRoot, each
        node is asked where gpu-train's files are before the cluster is handed out (a cluster's code hop
        and launch read every node's REMOTE_ROOT from it)."""
        unknown = [i for i in range(len(self._cluster.hosts)) if self._cluster.for_node(i).root_unknown] if self._cluster.ask_root else []
        for i in unknown:
            if i == self.node:
                self.connect()
                continue
            other = Session(self.env, None, self.timeout, i, self._cluster)
            try:
                other.connect()
            finally:
                other.close()
            self._cluster = self._cluster.root_known(i, other._cluster.node_roots[i])
        return self._cluster

    def nodes(self) -> list[Session]:
        """A session for every node of the cluster (this one for its own node)."""
        cluster = self.cluster
        return [
            self if i == self.node else Session(self.env, None, self.timeout, i, cluster, self.probe_shared)
            for i in range(len(cluster.hosts))
        ]

    def connect(self, again: bool = False, shared: bool = True) -> Any:  # (a Fabric Connection or a MuxConnection: Fabric is untyped)
        """Connect (``again``: reconnecting to a host that answered, whose sshd may be restarting).

        With ``shared`` (every task but the port forwards), this user's shared OpenSSH connection to
        the host is used when it is up (remote/ssh/mux.py): one round trip, no login; else a login,
        and the shared connection is started beside it for the next task."""
        from remote.errors import HostKeyError, RemoteError
        from remote.ssh import mux, vmprobe
        from remote.ssh import target as targets

        if self.conn is not None:
            return self.conn
        if shared and not again and not self._target.root_unknown:
            self.conn = self._shared()
            if self.conn is not None:
                return self.conn
        from remote.ssh import connect as ssh  # a login: paramiko is loaded only now (remote/cli.py)

        try:
            self.conn = ssh.open_connection(
                self._target,
                self._target.host,
                self.timeout,
                say,
                vmprobe.probe(self.env, self._target.stack, self._target.vm, say, self._instance),
                again,
            )
        except HostKeyError:
            raise  # (no refreshed address cures it)
        except RemoteError as e:
            if not self._target.is_gcp:
                raise Unreachable(str(e)) from None
            # The VM may have a new address (stopped and started: an ephemeral IP is new at each start): ask the
            # Compute API where it is now, else read the stack outputs again.
            from remote.ssh import readdress

            vm = self._target.vm or {}
            moved = readdress.rediscover(self.env, self._target.stack, vm.get("project"), self._instance)
            if moved:
                say(f"(the VM has a new address, from the Compute API: {self._target.stack}'s outputs updated)")
            self._cluster = targets.resolve(self.env, self._target.stack, refresh=not moved)
            self._target = self._cluster.for_node(self.node)
            try:
                self.conn = ssh.open_connection(self._target, self._target.host, self.timeout, say)
            except RemoteError as e2:
                raise Unreachable(
                    f"{e2}\nIf the VM was stopped (idle auto-stop, maxRunHours, or running: false), start it: "
                    f"pulumi up --refresh --stack {self._target.stack} (with gpu-train:running true)"
                ) from None
        if self._target.root_unknown:
            self._ask_root()
        if self.node == 0:
            self._alias()
        if shared:
            mux.start_master(self._target, self._target.host)
        return self.conn

    def _instance(self, vm: dict[str, Any]) -> dict[str, Any] | None:
        """The VM's instance as Compute Engine reports it (infra/ops/probes.py, loaded for a GCP stack only)."""
        from infra.ops import probes

        return probes.instance(self.env, vm)

    def _shared(self) -> Any:
        """A connection over the shared one when it is up, else None. With ``probe_shared``, only when it
        answers too: one that does not is ended, and an SSH host is taken for gone (UNREACHABLE)."""
        from remote.ssh import mux

        conn = mux.reuse(self._target, self._target.host)
        alive = mux.answers(self._target, self._target.host) if conn is not None and self.probe_shared else True
        if alive is False and not self._target.is_gcp:  # (a GCP VM may have a new address, which a login finds)
            raise Unreachable(
                f"cannot reach {self._target.host}: the shared SSH connection to it did not answer within "
                f"{mux.PROBE_S:g} s (the host is gone, or the way to it)"
            )
        return conn if alive is True else None

    def check_shared(self) -> None:
        """Before work that rides on the shared connection by itself (the fetch's streams), with
        ``probe_shared``: take it up here, so a vanished host is found in one round trip."""
        if self.conn is None and self.probe_shared and not self._target.root_unknown:
            self.conn = self._shared()

    def _ask_root(self) -> None:
        """First contact with an SSH host on the default remoteRoot: keep using the old default where
        that host has runs of ours (and say so), else the new one; the answer is kept for next time."""
        from gpu_train.contract import REMOTE_ROOT_BEFORE, REMOTE_ROOT_DEFAULT
        from remote.errors import RemoteError
        from remote.ssh import target as targets
        from remote.ssh.agentcall import run_bounded

        assert self.conn is not None
        try:  # a host's answer: bounded
            _, out, err = run_bounded(self.conn, targets.ROOT_QUESTION, timeout=60, cap=1 << 20)
        except RemoteError as e:
            raise Unreachable(str(e)) from None
        stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        root = targets.root_from_answer(stdout)
        if root is None:
            raise Unreachable(
                f"{self._target.host}: could not tell where gpu-train's files are (the login shell answered "
                f"{printable(stdout.strip()[:200] or stderr.strip()[:200])!r}); set "
                f"gpu-train:remoteRoot in the stack (e.g. {REMOTE_ROOT_DEFAULT})"
            )
        if root == REMOTE_ROOT_BEFORE:
            say(
                f"{self._target.host}: its runs are in {REMOTE_ROOT_BEFORE} (remoteRoot's old default), so they stay "
                f"there and this stack keeps using it (a new host gets {REMOTE_ROOT_DEFAULT}); to write it down: "
                f"gpu-train:remoteRoot: {REMOTE_ROOT_BEFORE} in the stack"
            )
        targets.remember_root(self._target.cache, self._target.host, root)
        self._cluster = self._cluster.root_known(self.node, root)
        self._target = self._cluster.for_node(self.node)

    def _alias(self) -> None:
        """``ssh gpu-train-STACK`` from the first contact on (written once, refreshed when the address changes)."""
        from remote.ssh import alias as sshalias

        sshalias.at_first_contact(
            self._cluster, sshalias.own_home(self.env), say, sshalias.terminal_ask(self.env), self.env.ssh_config, self.env.project_root
        )

    def reconnect(self) -> Any:
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        return self.connect(again=True)

    @overload
    def call(self, command: Literal["status"], *args: str, stdin: bytes = b"") -> StatusDoc: ...
    @overload
    def call(self, command: Literal["stop"], *args: str, stdin: bytes = b"") -> Stopped: ...
    @overload
    def call(self, command: Literal["launch-outcome"], *args: str, stdin: bytes = b"") -> LaunchOutcome: ...
    @overload
    def call(self, command: Literal["resume"], *args: str, stdin: bytes = b"") -> Resumed: ...
    @overload
    def call(self, command: Literal["prune"], *args: str, stdin: bytes = b"") -> Pruned: ...
    @overload
    def call(self, command: Literal["configure"], *args: str, stdin: bytes = b"") -> Configured: ...
    @overload
    def call(self, command: Literal["sweep-start"], *args: str, stdin: bytes = b"") -> SweepStarted: ...
    @overload
    def call(self, command: Literal["sweep-stop"], *args: str, stdin: bytes = b"") -> SweepStopped: ...
    @overload
    def call(self, command: Literal["sweep-status"], *args: str, stdin: bytes = b"") -> SweepStatus: ...
    @overload
    def call(self, command: str, *args: str, stdin: bytes = b"") -> Any: ...
    def call(self, command: str, *args: str, stdin: bytes = b"") -> Any:
        """The agent's ``command`` on this node: its answer as the contract declares it (answers.ANSWERS),
        its run ids checked before any becomes a path; RemoteError otherwise."""
        from remote.ssh import agentcall
        from remote.tasks.trust import host_doc

        doc = agentcall.call(self.connect(), self._target, command, *args, stdin=stdin)
        return host_doc(doc, self._target.host)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None  # a later call connects again


class Cancelled(KeyboardInterrupt):
    """Ctrl-C while ``on_every_node`` ran with a ``cancel`` event: ``results`` as each node's work
    ended once told to stop (an answer where it had finished anyway, an error where it stopped)."""

    def __init__(self, results: Sequence[object]):
        super().__init__()
        self.results = results


T = TypeVar("T")


def on_every_node(sessions: list[Session], work: Callable[[Session], T], cancel: threading.Event | None = None) -> list[T | GpuTrainError]:
    """``work(session)`` on each node at once; results in node order, where a node that raised has
    its error (``as_error``): any exception is that node's failure, never a missing result.

    Ctrl-C reaches the main thread only. With ``cancel``, it is set for the work to see, every node's
    work is waited for, and ``Cancelled`` says how each ended; without, KeyboardInterrupt goes on."""
    results: list[T | GpuTrainError] = [GpuTrainError("no answer")] * len(sessions)  # (each is set: an answer or why not)

    def run(i: int) -> None:
        try:
            results[i] = work(sessions[i])
        except Exception as e:  # (a node's bug or lost connection fails that node only)
            results[i] = as_error(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(sessions))]
    started: list[threading.Thread] = []
    try:
        for t in threads:
            t.start()
            started.append(t)
        for t in started:
            t.join()
    except KeyboardInterrupt:
        if cancel is None:
            raise
        cancel.set()
        for t in started:  # a second Ctrl-C here leaves at once, as a plain KeyboardInterrupt
            t.join()
        raise Cancelled(results) from None
    return results


def failures(results: Sequence[object]) -> list[str]:
    """One line per node that failed, naming it."""
    return [f"node {i}: {outcome(r)[1]}" for i, r in enumerate(results) if isinstance(r, GpuTrainError)]


def nodes_failed(results: Sequence[object], after: str = "") -> GpuTrainError:
    """The nodes' failures in ``results`` as one error: a line per node (``failures``), then ``after``; its
    exit status theirs where they share one (every node out of reach: UNREACHABLE), else FAILED (errors.joined)."""
    return joined([r for r in results if isinstance(r, GpuTrainError)], "; ".join(failures(results)) + after)


def every_answer(results: list[T | GpuTrainError]) -> list[T]:
    """Every node's answer, in node order; an error naming each node that failed, if any did (``nodes_failed``)."""
    if failures(results):
        raise nodes_failed(results)
    return [r for r in results if not isinstance(r, GpuTrainError)]
