"""The dashboard's one way of asking: a poller per stack, its last look shared by every browser tab.

Each poller asks its stack what `ls` and `status` ask (the stack's settings and last known outputs, the
Compute API's view of its VMs, every node's `status --summaries` over the shared SSH connection) once
per interval, and keeps the answer (``StackLook``); pages read that, never the host. So the hosts see
one agent call per node per interval however many tabs are open, and none while no page has asked for
a while (``IDLE_AFTER_S``). What it gathers is the same typed documents the tasks read; the decisions
are ``gpu_train.views.board``'s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_train.catalog.model import Catalog
from gpu_train.environment import Environment
from gpu_train.errors import GpuTrainError, as_error, outcome
from gpu_train.gcp.vm import label_value
from gpu_train.identity import Scope, name_of
from gpu_train.views import board, listing
from remote.tasks import gather
from remote.tasks.frombucket import destination
from remote.tasks.localstate import FetchRecord, local_summary

if TYPE_CHECKING:
    from gpu_train.stack.settings import StackConfig
    from gpu_train.views.checkup import Adc
    from remote.tasks.session import Session

IDLE_AFTER_S = 120.0  # no page asked for this long: the pollers stop asking the hosts until one does
ASK_TIMEOUT_S = 20.0  # connecting to a host, per poll
BACK_OFF_S = 120.0  # a host that does not answer is asked at least this often
LOCAL_LOOK_S = 30.0  # a run's copy here is walked again this often while the host's summaries stay the same


class Google:
    """The Application Default Credentials, read once and kept (their token is reused until it expires, not
    asked for at every look); read again after a call that failed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.found: tuple[Adc, Any] | None = None  # (google-auth's credentials)

    def credentials(self) -> tuple[Adc, Any]:
        """(the ADC, credentials with a valid token or None); RuntimeError when the token cannot be had."""
        from infra.ops import probes

        with self.lock:
            if self.found is None:
                self.found = probes.read_adc()
            creds: Any = self.found[1]  # (google-auth's credentials: untyped)
            if creds is not None and not creds.valid:  # one refresh for every poller (they share the token)
                from google.auth.transport.requests import Request

                try:
                    creds.refresh(Request())
                except Exception as e:  # the token endpoint or the network: said as the API's failure
                    self.found = None
                    raise RuntimeError(f"{type(e).__name__}: {e}") from None
            return self.found

    def forget(self) -> None:
        with self.lock:
            self.found = None


def compute_view(env: Environment, cfg: StackConfig, google: Google) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The Compute API's VMs of a GCP stack (None without credentials), or why it could not say."""
    from infra.ops import probes

    try:
        adc, creds = google.credentials()
        if creds is None:
            return None, ("no credentials (gcloud auth application-default login)" if adc.exists else None)
        found = probes.gpu_train_instances(env, creds, cfg.project or "")
    except RuntimeError as e:
        google.forget()
        return None, str(e)
    mine = [i for i in found if (i.get("labels") or {}).get("gpu-train-stack") == label_value(cfg.stack)]
    return sorted(mine, key=lambda i: int((i.get("labels") or {}).get("gpu-train-node", "0") or 0)), None


def one_state_each(nodes: tuple[board.NodeLook, ...]) -> tuple[dict[str, Any], ...]:
    """The runs as `status` shows a cluster's: one state per run across its nodes (node 0's runs)."""
    from gpu_train.jobs import aggregate_runs

    docs: list[dict[str, Any] | None] = [dict(n.status) if n.status is not None else None for n in nodes]
    lead = docs[0] if docs else None
    if lead is None:
        return ()
    runs: list[dict[str, Any]] = aggregate_runs(docs)["runs"] if len(docs) > 1 else lead["runs"]
    return tuple(runs)


class StackPoller:
    """One stack's poller: a thread that looks at it every ``interval`` while pages want it."""

    def __init__(self, env: Environment, path: Path, interval: float, wanted: Callable[[], bool], scope: Scope | None, google: Google):
        self.env, self.path, self.interval, self.wanted, self.scope = env, path, interval, wanted, scope
        self.google = google
        self.name = path.name.removeprefix("Pulumi.").rsplit(".", 1)[0]
        self.look: board.StackLook = board.StackLook(listing.StackFacts(self.name))
        self.polls = 0  # looks taken (each one agent call per node)
        self.session: Session | None = None
        self.sessions: list[Session] = []  # every node's, the session's own first
        self.changed = threading.Event()  # set after each look (tests and the report wait on it)
        self._homes: dict[str, tuple[tuple[object, object], float, bool]] = {}  # run -> (its host summaries, when looked, home)
        self._failures, self._retry_at = 0, 0.0  # a host that did not answer is asked again later and later
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"poll-{self.name}", daemon=True)

    def start(self) -> StackPoller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        self._thread.join(ASK_TIMEOUT_S + 5)
        self._close()

    def kick(self) -> None:
        """Look again now (after an action: its copies here looked at again too), not at the next interval."""
        self._homes.clear()
        self._retry_at = 0.0
        self._kick.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self.wanted():
                try:
                    self.poll()
                except Exception as e:  # a look's failure is this stack's message on the page, never the poller's end
                    self._close()
                    error = outcome(as_error(e))[1]
                    self.look = board.StackLook(self.look.facts, (board.NodeLook(0, "?", error=error),), (), {}, time.time())
            self._kick.wait(self.interval)
            self._kick.clear()

    def poll(self) -> board.StackLook:
        """One look: the stack's facts as `ls` gathers them, every node's status as `status` asks it."""
        name, cfg, problem = gather.load(self.path)
        home = self.env.state_home
        facts = listing.StackFacts(name, cfg, problem=problem)
        nodes: tuple[board.NodeLook, ...] = ()
        runs: tuple[dict[str, Any], ...] = ()
        fetched: dict[str, bool] = {}
        if cfg is not None:
            outputs = gather.cached_outputs(home, name) if cfg.is_gcp else None
            instances, api_error = compute_view(self.env, cfg, self.google) if cfg.is_gcp else (None, None)
            facts = listing.StackFacts(
                name, cfg, outputs=outputs, instances=instances, api_error=api_error, ledger=gather.Ledger(home, name).read()
            )
            if gather._worth_asking(facts) and time.monotonic() >= self._retry_at:
                nodes, fetched = self._ask()
                runs = one_state_each(nodes)
                self._back_off(any(n.status is not None for n in nodes))
            elif gather._worth_asking(facts):  # (backing off: the last answer, or the last failure, stays)
                nodes, runs, fetched = self.look.nodes, self.look.runs, self.look.home
            if cfg.is_gcp:
                status = next((n.status for n in nodes if n.status), None)
                gather.Ledger(home, name).write(listing.observed(listing.StackFacts(**{**facts.__dict__, "status": status}), time.time()))
        mine = None if self.scope is None else frozenset(r["id"] for r in runs if self.scope.keeps(r.get("project")))
        owners = {r["id"]: name_of(r.get("project")) for r in runs}
        self.look = board.StackLook(facts, nodes, runs, fetched, time.time(), mine, owners)
        self.polls += 1
        self.changed.set()
        return self.look

    def _back_off(self, answered: bool) -> None:
        """After a look no node answered: the next in 2, 4, ... intervals, at most BACK_OFF_S (a GCP host out
        of reach has each connect try the Compute API and `pulumi stack output`)."""
        self._failures = 0 if answered else self._failures + 1
        wait = 0.0 if answered else min(BACK_OFF_S, self.interval * 2**self._failures)
        self._retry_at = time.monotonic() + wait

    def _ask(self) -> tuple[tuple[board.NodeLook, ...], dict[str, bool]]:
        """Every node's `status --summaries`, at once, over sessions kept from one look to the next."""
        from remote.tasks.session import Session, on_every_node

        try:
            if self.session is None:
                self.session = Session(self.env, self.name, timeout=ASK_TIMEOUT_S)
                self.sessions = self.session.nodes()
            docs = on_every_node(self.sessions, lambda s: s.call("status", "--summaries"))
        except GpuTrainError as e:
            self._close()
            return (board.NodeLook(0, "?", error=outcome(e)[1]),), {}
        looks = []
        for s, doc in zip(self.sessions, docs, strict=True):
            if isinstance(doc, GpuTrainError):
                looks.append(board.NodeLook(s.node, str(s.target.host), error=outcome(doc)[1].splitlines()[0]))
                s.close()  # (the next look connects again)
            else:
                looks.append(board.NodeLook(s.node, str(s.target.host), status=doc))
        lead = next((d for d in docs if isinstance(d, dict)), None)
        return tuple(looks), self._home(lead["runs"] if lead else [])

    def _home(self, runs: Sequence[Mapping[str, Any]]) -> dict[str, bool]:
        """Which runs are home as they are on the host now: their copy where `fetch` puts it (node 0's) holds
        what the host's summaries of JOB_DIR and of the working directory's outputs say, or the fetch
        record says so."""
        from gpu_train.contract import RUN_FILES, WORKDIR

        assert self.session is not None
        record = FetchRecord(self.session.target.cache)
        home = {}
        for r in runs:
            seen = (r.get("jobSummary"), r.get("workdirSummary"))
            kept = self._homes.get(r["id"])
            if kept is not None and kept[0] == seen and time.monotonic() - kept[1] < LOCAL_LOOK_S:
                home[r["id"]] = kept[2]
                continue
            dest = destination(self.env, self.name, r["id"], None, False)
            local = None
            if dest.is_dir():
                skip = {WORKDIR, RUN_FILES, *(p.name for p in dest.glob("node-*"))}
                local = (local_summary(dest, skip), local_summary(dest / WORKDIR))
            home[r["id"]] = board.is_home(r, local) or record.up_to_date(r, dest)
            self._homes[r["id"]] = (seen, time.monotonic(), home[r["id"]])
        return home

    def _close(self) -> None:
        for s in self.sessions:
            s.close()
        self.session, self.sessions = None, []


class Watch:
    """Every stack's poller and their shared answers: what the server hands each page."""

    def __init__(
        self,
        env: Environment,
        catalog: Catalog,
        interval: float,
        project: str,
        idle_after: float = IDLE_AFTER_S,
        scope: Scope | None = None,
    ):
        """``project``: the page's title; ``scope``: whose runs are this project's (None: every run is)."""
        self.env, self.catalog, self.interval, self.project = env, catalog, interval, project
        self.idle_after = idle_after
        self.asked = time.monotonic()
        google = Google()
        self.pollers = [StackPoller(env, p, interval, self._wanted, scope, google) for p in gather.stack_files(env)]

    def _wanted(self) -> bool:
        return time.monotonic() - self.asked < self.idle_after

    def start(self) -> Watch:
        for p in self.pollers:
            p.start()
        return self

    def stop(self) -> None:
        for p in self.pollers:
            p._stop.set()
            p._kick.set()
        for p in self.pollers:
            p.stop()

    def poller(self, stack: str) -> StackPoller | None:
        return next((p for p in self.pollers if p.name == stack), None)

    def host_runs(self, stack: str) -> list[dict[str, Any]]:
        """The stack's runs as node 0 last answered (the status documents, summaries and all)."""
        p = self.poller(stack)
        status = next((n.status for n in p.look.nodes if n.status), None) if p else None
        return [dict[str, Any](r) for r in status["runs"]] if status else []

    def board(self) -> dict[str, Any]:
        """The page's document from every stack's last look (no host is asked here)."""
        if not self._wanted():  # the first page after a quiet while: every stack is looked at now
            for p in self.pollers:
                p.kick()
        self.asked = time.monotonic()
        return board.board([p.look for p in self.pollers], time.time(), self.catalog, self.project, self.interval)

    def look_once(self) -> dict[str, Any]:
        """Every stack looked at now, at once (the report's single look)."""
        threads = [threading.Thread(target=p.poll, daemon=True) for p in self.pollers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for p in self.pollers:
            p._close()
        return self.board()
