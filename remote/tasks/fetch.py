"""`fab fetch`: bring JOB_DIRs home (once, or while a run trains); `down` and its guards are in teardown.py."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke import Context, task

from gpu_train.contract import ACTIVE
from gpu_train.environment import Environment
from gpu_train.errors import ExitStatus, GpuTrainError, Unreachable, UsageError
from gpu_train.identity import Scope
from remote.tasks import frombucket, trust
from remote.tasks.frombucket import destination, node_dir
from remote.tasks.localstate import FetchRecord
from remote.tasks.session import ALL_PROJECTS_HELP, CLI, STACK_HELP, Session, failures, on_every_node, say
from remote.tasks.taskoptions import FetchOptions
from remote.transfer.fetch.generator import DEFAULT_STREAMS

if TYPE_CHECKING:
    from remote.transfer.fetch.progress import Progress
    from remote.transfer.fetch.report import RunResult


def fetch_runs(
    session: Session,
    runs: Sequence[Mapping[str, Any]],
    dest: str | None,
    progress: bool,
    quiet: bool = False,
    subdir: str = "",
    streams: int = DEFAULT_STREAMS,
    strict: bool = False,
) -> list[str]:
    """Fetch the runs' JOB_DIRs (into ``subdir`` of each run's folder), the outputs in their working
    directories (into its workdir/) and their logs (into its .gpu-train/) in one transfer session: one listing of every run, then parallel
    streams for whatever changed. What is not home as it should be, one line each ("RUN: why"); with
    ``strict`` (the guards before destroying) a host's file not taken because the laptop's is newer too."""
    from gpu_train import jobs
    from gpu_train.contract import RUN_FILES, RUN_LOG, WORKDIR
    from remote.ssh.openssh import knows_host
    from remote.transfer.fetch import report as fetch_report
    from remote.transfer.fetch.progress import Progress

    record = FetchRecord(session.target.cache)
    todo = []
    base = Path(dest) if dest else session.env.project_root / "runs" / session.target.stack
    for r in runs:
        try:
            jobs.check_run_id(r["id"], "a run id from the host")
        except jobs.JobError as e:
            raise GpuTrainError(str(e)) from None
        where = destination(session.env, session.target.stack, r["id"], dest, len(runs) > 1, subdir)
        trust.inside(where, base)  # resolved, it stays in its base: a symlink planted there cannot lead out
        if record.up_to_date(r, where):
            if not quiet:
                say(f"{r['id']}: up to date in {where}")
            continue
        todo.append((r, where))
    if not todo:
        return []
    session.check_shared()  # a shared connection whose host vanished: found now, not after its keepalive's 15 s
    if not knows_host(session.target, session.target.host):
        session.connect()  # learns (and prints) the host key, or refuses a changed one
    bar = Progress(live=progress)
    sources = [
        (s, p)
        for r, where in todo
        for s, p in ((r["id"], where), (f"{r['id']}/{WORKDIR}", where / WORKDIR), (f"{r['id']}/{RUN_FILES}", where / RUN_FILES))
    ]
    results = _transfer(session, sources, streams, bar)
    problems = []
    for (r, where), job, work, log in zip(todo, results[::3], results[1::3], results[2::3], strict=True):
        empty = job.up_to_date and not (job.summary or {}).get("files")  # a JOB_DIR the job never wrote in
        if not (empty and (work.files or log.files)):  # ("up to date" above what this fetch brought is no news)
            for line in fetch_report.notes(job, where):
                say(line)
        if work.error is not None or work.files or not work.up_to_date or (work.summary or {}).get("files"):
            for line in fetch_report.notes(work, where / WORKDIR):
                say(line.replace(work.run_id, f"{r['id']} working directory's outputs", 1))
        if log.files and not quiet:
            say(f"{r['id']}: its log (the job's stdout and stderr) -> {where / RUN_FILES / RUN_LOG}")
        if not log.complete:
            for line in fetch_report.notes(log, where / RUN_FILES)[1:]:
                say(line)
        lost = list(
            dict.fromkeys(
                [f"{r['id']}: {m}" for res in (job, work) for m in res.missing()]
                + [f"{r['id']}: its log: {m}" for m in log.missing() if m != job.error]
            )
        )
        newer = [
            f"{r['id']}: {p}: the host's differs, and the laptop's copy is newer (kept)" for res in (job, work, log) for p in res.kept_newer
        ]
        # A link out of the run (a checkpoint folder on a scratch disk): what it points to is not home.
        outside = [f"{r['id']}: a link out of the run, what it points to is not home: {p}" for res in (job, work) for p in res.unsafe]
        problems += lost + (newer + outside if strict else [])
        if not lost and not newer:
            record.record(r, where)
    record.save()
    if not quiet or any(res.files for res in results):
        say(fetch_report.summary_line(results, bar.elapsed, streams, runs=len(todo)))
    return problems


def _transfer(session: Session, runs: list[tuple[str, Path]], streams: int, bar: Progress) -> list[RunResult]:
    """The engine over OpenSSH; on GCP a host that cannot be reached may have a new address (refreshed once)."""
    from remote.transfer.fetch.engine import Fetcher
    from remote.transfer.fetch.stream import Opener

    for attempt in (1, 2):
        opener = Opener(session.target, session.target.host)
        try:
            results = Fetcher(opener, streams, bar).run(runs)
        finally:
            opener.close()
        unreachable = all(r.unreachable for r in results)
        if unreachable and (attempt == 2 or not session.target.is_gcp):  # (a stack with a bucket fetches from it)
            raise Unreachable(f"cannot reach {session.target.host} over SSH ({results[0].error})")
        if attempt == 2 or not unreachable or not session.target.is_gcp:
            return results
        session.reconnect()  # refreshes the stack outputs when the VM moved
    return results


@task(
    help={
        "run": "run id (default: this project's newest)",
        "all": "every run of this project (with --all-projects: every run on the host)",
        "all_projects": ALL_PROJECTS_HELP,
        "dest": "where to (default runs/STACK/RUN/)",
        "watch": "keep fetching new checkpoints until the run ends",
        "interval": "seconds between --watch rounds (30)",
        "node": "which node (default 0; node N's files go into RUN/node-N/)",
        "all_nodes": "every node's files (node N's into RUN/node-N/; default: node 0's, where checkpoints are written)",
        "streams": f"parallel SSH streams (default {DEFAULT_STREAMS}; 1 for a single stream)",
        "json": "print what was fetched where as JSON",
        "stack": STACK_HELP,
        "from": "`bucket`: from the stack's gpu-train:bucket instead of the host (also used by itself when the host cannot be reached)",
        "sweep": "every trial of this sweep (each from its node, into runs/STACK/RUN/)",
    }
)
def fetch(
    c: Context,
    run: str | None = None,
    all_: bool = False,
    dest: str | None = None,
    watch: bool = False,
    interval: str | None = None,
    node: str | None = None,
    all_nodes: bool = False,
    streams: str | None = None,
    stack: str | None = None,
    json_: bool = False,
    from_: str | None = None,
    sweep: str | None = None,
    all_projects: bool = False,
) -> None:
    """Bring a run's results home: its JOB_DIR, and what the job wrote in its working directory.

    JOB_DIR's files go into runs/STACK/RUN/, the working directory's outputs (a checkpoint in the
    project's own out_dir) into runs/STACK/RUN/workdir/, the run's log (the job's stdout and stderr)
    into runs/STACK/RUN/.gpu-train/log.

    Incremental and resumable: files move over several SSH streams at once (big files in ranges), each
    piece checked against the SHA-256 the host computed, and each file renamed into place only when
    complete. A local file of other content that a fetch replaces is kept in runs/STACK/RUN/.previous/
    (one previous version per file). Exits non-zero, naming each, when anything the host has is not home.
    With --watch it fetches while the run trains, so the laptop's copy trails by at most one checkpoint.
    """
    o = FetchOptions.read(
        run=run,
        all=bool(all_),
        dest=dest,
        watch=bool(watch),
        interval=interval,
        node=node,
        all_nodes=bool(all_nodes),
        streams=streams,
        stack=stack,
        as_json=bool(json_),
        source=from_,
        sweep=sweep,
        all_projects=bool(all_projects),
    )
    fetch_with(Environment.of(c), o)


def fetch_with(env: Environment, o: FetchOptions) -> None:
    """`fetch`'s work for checked options: a sweep's trials, the bucket, or the host (the bucket when it
    cannot be reached)."""
    session = Session(env, o.stack, node=o.node, probe_shared=True)
    scope = env.scope(o.all_projects)
    if o.sweep is not None:
        _fetch_sweep(session, o.sweep, o.streams, scope)
        return
    if o.source == "bucket":
        frombucket.from_bucket(session.env, session.cluster, o.run, o.all, o.dest, o.streams)
        return
    followed: dict[str, str] = {}  # the run --watch follows, once known
    try:
        _fetch_from_host(session, o, followed, scope)
    except GpuTrainError as e:
        if e.status != ExitStatus.UNREACHABLE or not session.cluster.bucket:
            raise
        every = " (every node's files: node N's in node-N/)" if o.all_nodes or len(session.cluster.hosts) > 1 else ""
        say(f"{e}\nthe host cannot be reached: fetching from the bucket {session.cluster.bucket} instead{every}")
        frombucket.from_bucket(session.env, session.cluster, followed.get("run", o.run), o.all, o.dest, o.streams)
        if o.watch:
            raise Unreachable(
                "--watch: fetched what the bucket holds now, but not watching: only the host knows whether the "
                f"run still trains. Run `{CLI} fetch --watch` again once it can be reached"
            ) from None


def _fetch_sweep(session: Session, sweep: str, streams: int, scope: Scope) -> None:
    """Every trial of ``sweep`` that started, each from its node, into runs/STACK/RUN/."""
    from remote.tasks.sweepcalls import sweep_rows

    rows, _ = sweep_rows(session, sweep, None, "min")
    on = {int(r["node"]) for r in rows if r["state"] != "pending"}  # a trial is one node's run: into runs/STACK/RUN/

    def trials(s: Session) -> list[str]:
        runs = [x for r in rows if int(r["node"]) == s.node and r["state"] != "pending" for x in _which_runs(s, r["runId"], False, scope)]
        return fetch_runs(s, runs, None, progress=False, streams=streams)

    lost = on_every_node([s for s in session.nodes() if s.node in on], trials)
    if problems := failures(lost) + [m for x in lost if isinstance(x, list) for m in x]:
        raise GpuTrainError(f"not every trial is home ({len(problems)}):\n  " + "\n  ".join(problems[:20]))
    say(f"sweep {sweep}: {sum(1 for r in rows if r['state'] != 'pending')} trial(s) home in runs/{session.target.stack}/")


def _fetch_from_host(session: Session, o: FetchOptions, followed: dict[str, str], scope: Scope) -> None:
    run, dest, streams = o.run, o.dest, o.streams
    if o.watch:
        _watch(session, run, dest, o.interval, streams, followed, scope)
        return
    sessions = session.nodes() if o.all_nodes else [session]
    if len(sessions) > 1 and not o.all and run is None:  # the newest run is node 0's, fetched from every node
        run = _mine(session.call("status")["runs"], scope)[-1]["id"]

    def one(s: Session) -> tuple[Sequence[Mapping[str, Any]], list[str]]:
        runs = _which_runs(s, run, o.all, scope)
        return runs, fetch_runs(
            s, runs, dest, progress=s.env.stderr_isatty and not o.as_json and len(sessions) == 1, subdir=node_dir(s.node), streams=streams
        )

    results: list[object] = on_every_node(sessions, one) if len(sessions) > 1 else [one(session)]
    for s in sessions:
        s.close()
    results = frombucket.gone_nodes(session, sessions, results, run, o.all, dest, streams)
    problems = [m for m in failures(results)]
    fetched = []
    for s, r in zip(sessions, results, strict=True):
        if isinstance(r, tuple):
            runs, lost = r
            problems += [f"node {s.node}: {m}" if len(sessions) > 1 else m for m in lost]
            failed_ids = {m.split(":", 1)[0] for m in lost}
            fetched += [
                {
                    "runId": x["id"],
                    "node": s.node,
                    "failed": x["id"] in failed_ids,
                    "dest": str(destination(session.env, session.target.stack, x["id"], dest, len(runs) > 1, node_dir(s.node))),
                }
                for x in runs
            ]
    if o.as_json:
        print(
            json.dumps(
                {
                    "fetched": [f for f in fetched if not f["failed"]],
                    "failed": sorted({f["runId"] for f in fetched if f["failed"]}),
                    "problems": problems,
                },
                indent=1,
            )
        )
    if problems:
        raise GpuTrainError(
            f"not everything is home ({len(problems)}):\n  "
            + "\n  ".join(problems[:20])
            + (f"\n  and {len(problems) - 20} more" if len(problems) > 20 else "")
            + f"\nFix what is named (a file the host cannot read, something in the way here) and run `{CLI} fetch` "
            "again: it resumes"
        )


def _mine(runs: Sequence[Mapping[str, Any]], scope: Scope) -> list[Mapping[str, Any]]:
    """The scope's runs of a status document's (oldest first); an error saying so when there are none."""
    mine, others = scope.split(runs)
    if not mine:
        more = f" ({len(others)} of other projects: name one with --run, or add --all-projects)" if others else ""
        raise GpuTrainError(f"no runs of this project on this host yet{more}" if others else "no runs on this host yet")
    return mine


def _which_runs(session: Session, run: str | None, all_: bool, scope: Scope) -> Sequence[Mapping[str, Any]]:
    """The runs to fetch from a node: a named one, a prefix the host resolves, every run, or the newest
    (of the scope's: this project's by default)."""
    runs: Sequence[Mapping[str, Any]]
    if run and not all_ and re.search(r"_\d{8}_\d{6}$", run) is None:  # a prefix or a base name: the host knows
        runs = session.call("status", "--summaries", "--run", run, *scope.agent_args())["runs"]
    elif run and not all_:
        # A named run: no status call; the fetch's own listing says whether it exists and what changed.
        from gpu_train import jobs

        try:
            runs = [{"id": jobs.check_run_id(run, "--run"), "state": "?"}]
        except jobs.JobError as e:
            raise UsageError(str(e)) from None
    else:
        # Which runs there are; what changed in them comes from the fetch's own listing of them all
        # (the host walks each JOB_DIR once, not once for summaries and once more to fetch).
        mine = _mine(session.call("status")["runs"], scope)
        runs = mine if all_ else mine[-1:]
    if not runs:
        raise GpuTrainError("no runs on this host yet")
    return runs


def _watch(
    session: Session, run: str | None, dest: str | None, interval: float, streams: int, followed: dict[str, str], scope: Scope
) -> None:
    """Fetch a run's new files every ``interval`` seconds until it ends, then once more (``followed``
    names the run from its first answer on: the bucket's fallback takes that one)."""
    while True:
        doc = session.call("status", "--summaries", *(["--run", run, *scope.agent_args()] if run else []))
        current = (doc["runs"] if run else _mine(doc["runs"], scope))[-1]
        run = followed["run"] = current["id"]
        problems = fetch_runs(session, [current], dest, progress=False, quiet=True, streams=streams, subdir=node_dir(session.node))
        if current["state"] not in ACTIVE:
            if problems:
                raise GpuTrainError(f"{run} is {current['state']}, but not everything is home:\n  " + "\n  ".join(problems))
            say(f"{run} is {current['state']}: fetched everything")
            return
        session.close()  # the next round's first call checks the shared connection again (a host gone meanwhile)
        time.sleep(interval)
