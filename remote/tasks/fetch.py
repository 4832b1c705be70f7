"""`fab fetch` and `fab down`: bring JOB_DIRs home (once, or while a run trains), then stop billing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from invoke import Exit, task

from gpu_train.contract import ACTIVE
from gpu_train.errors import ExitStatus
from gpu_train.stack.project import project_root
from remote.tasks import trust
from remote.tasks.localstate import FetchRecord
from remote.tasks.runs import cluster_status
from remote.tasks.session import CLI, STACK_HELP, Session, failures, on_every_node, say
from remote.transfer.fetch.generator import DEFAULT_STREAMS


def destination(stack: str, run: str, dest: str | None, several: bool, subdir: str = "") -> Path:
    """Where a run's JOB_DIR goes: --dest (RUN/ under it for several runs), else the project's runs/STACK/RUN."""
    where = Path(dest) / run if dest and several else Path(dest or project_root() / "runs" / stack / run)
    return where / subdir if subdir else where


def fetch_runs(session: Session, runs: list[dict], dest: str | None, progress: bool, quiet: bool = False,
               subdir: str = "", streams: int = DEFAULT_STREAMS) -> list[str]:
    """Fetch the runs' JOB_DIRs (into ``subdir`` of each run's folder) in one transfer session: one
    listing of every run, then parallel streams for whatever changed. The ids that failed."""
    from gpu_train import jobs
    from remote.ssh import hostkeys
    from remote.transfer.fetch import report as fetch_report
    from remote.transfer.fetch.progress import Progress

    record = FetchRecord(session.target.cache)
    todo = []
    base = Path(dest) if dest else project_root() / "runs" / session.target.stack
    for r in runs:
        try:
            jobs.check_run_id(r["id"], "a run id from the host")
        except jobs.JobError as e:
            raise Exit(str(e), code=ExitStatus.FAILED) from None
        where = destination(session.target.stack, r["id"], dest, len(runs) > 1, subdir)
        trust.inside(where, base)  # resolved, it stays in its base: a symlink planted there cannot lead out
        if record.up_to_date(r, where):
            if not quiet:
                say(f"{r['id']}: up to date in {where}")
            continue
        todo.append((r, where))
    if not todo:
        return []
    if not hostkeys.knows_host(session.target, session.target.host):
        session.connect()  # learns (and prints) the host key, or refuses a changed one
    bar = Progress(live=progress)
    results = _transfer(session, [(r["id"], where) for r, where in todo], streams, bar)
    failed = []
    for (r, where), result in zip(todo, results, strict=True):
        for line in fetch_report.notes(result, where):
            say(line)
        if result.error is not None:
            failed.append(r["id"])
        elif result.complete:
            record.record(r, where)
    record.save()
    if not quiet or any(res.files for res in results):
        say(fetch_report.summary_line(results, bar.elapsed, streams))
    return failed


def _transfer(session: Session, runs: list[tuple[str, Path]], streams: int, bar) -> list:
    """The engine over OpenSSH; on GCP a host that cannot be reached may have a new address (refreshed once)."""
    from remote.transfer.fetch.engine import Fetcher
    from remote.transfer.fetch.stream import Opener

    for attempt in (1, 2):
        opener = Opener(session.target, session.target.host)
        try:
            results = Fetcher(opener, streams, bar).run(runs)
        finally:
            opener.close()
        unreachable = all(r.error and "ssh exit 255" in r.error and r.summary is None for r in results)
        if attempt == 2 or not unreachable or not session.target.is_gcp:
            return results
        session.reconnect()  # refreshes the stack outputs when the VM moved
    return results


@task(help={"run": "run id (default: the newest)", "all": "every run", "dest": "where to (default runs/STACK/RUN/)",
            "watch": "keep fetching new checkpoints until the run ends", "interval": "seconds between --watch rounds (30)",
            "all_nodes": "each node's JOB_DIR into RUN/node-N/ (default: node 0's, where checkpoints are written)",
            "streams": f"parallel SSH streams (default {DEFAULT_STREAMS}; 1 for a single stream)",
            "json": "print what was fetched where as JSON", "stack": STACK_HELP})
def fetch(c, run=None, all_=False, dest=None, watch=False, interval=None, all_nodes=False, streams=None,
          stack=None, json_=False):
    """Bring a run's JOB_DIR home: incremental, resumable, each file complete and verified before use.

    Files move over several SSH streams at once (big files in ranges), each piece checked against
    the SHA-256 the host computed, and each file renamed into place only when complete. With
    --watch it fetches while the run trains, so the laptop's copy trails by at most one checkpoint.
    """
    streams = _streams(streams)
    run, interval = trust.run_option(run), trust.number("--interval", 30 if interval is None else interval, float, 0)
    session = Session(stack)
    if watch:
        _watch(session, run, dest, interval, streams)
        return
    if all_nodes:
        _fetch_every_node(session, run, dest, streams)
        return
    if run and not all_ and re.search(r"_\d{8}_\d{6}$", run) is None:  # a prefix or a base name: the host knows
        runs = session.call("status", "--summaries", "--run", run)["runs"]
    elif run and not all_:
        # A named run: no status call; the fetch's own listing says whether it exists and what changed.
        from gpu_train import jobs

        try:
            runs = [{"id": jobs.check_run_id(run, "--run"), "state": "?"}]
        except jobs.JobError as e:
            raise Exit(str(e), code=ExitStatus.USAGE) from None
    else:
        # Which runs there are; what changed in them comes from the fetch's own listing of them all
        # (the host walks each JOB_DIR once, not once for summaries and once more to fetch).
        doc = session.call("status")
        runs = doc["runs"] if all_ else doc["runs"][-1:]
    if not runs:
        raise Exit("no runs on this host yet", code=ExitStatus.FAILED)
    failed = fetch_runs(session, runs, dest, progress=sys.stderr.isatty() and not json_, streams=streams)
    session.close()
    if json_:
        print(json.dumps({"fetched": [{"runId": r["id"], "dest": str(destination(session.target.stack, r["id"], dest,
                                                                                   len(runs) > 1))}
                                      for r in runs if r["id"] not in failed], "failed": failed}, indent=1))
    if failed:
        raise Exit(f"fetch failed for {', '.join(failed)}: run `{CLI} fetch` again to resume", code=ExitStatus.FAILED)


def _streams(value: object) -> int:
    """--streams as a number (the tasks default it to None, not an int: Invoke would parse an int
    default itself and fail on "abc" with a traceback instead of this message)."""
    if value is None:
        return DEFAULT_STREAMS
    try:
        n = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        n = 0
    if not 1 <= n <= 64:
        raise Exit(f"--streams {value}: a number of parallel SSH streams from 1 to 64 (default {DEFAULT_STREAMS})",
                   code=ExitStatus.USAGE)
    return n


def _fetch_every_node(session: Session, run: str | None, dest: str | None, streams: int) -> None:
    sessions = session.nodes()
    lead = session.call("status", *(["--run", run] if run else []))["runs"]
    if not lead:
        raise Exit("no runs on this host yet", code=ExitStatus.FAILED)
    run_id = lead[-1]["id"]

    def one(s: Session) -> list[str]:
        return fetch_runs(s, [{"id": run_id, "state": "?"}], dest, progress=False, subdir=f"node-{s.node}",
                          streams=streams)

    results = on_every_node(sessions, one)
    for s in sessions:
        s.close()
    failed = failures(results) + [f"node {i}" for i, r in enumerate(results) if isinstance(r, list) and r]
    if failed:
        raise Exit(f"fetch failed for {', '.join(failed)}: run `{CLI} fetch --all-nodes` again to resume", code=ExitStatus.FAILED)


def _watch(session: Session, run: str | None, dest: str | None, interval: float, streams: int) -> None:
    """Fetch a run's new files every ``interval`` seconds until it ends, then once more."""
    while True:
        doc = session.call("status", "--summaries", *(["--run", run] if run else []))
        if not doc["runs"]:
            raise Exit("no runs on this host yet", code=ExitStatus.FAILED)
        current = doc["runs"][-1]
        run = current["id"]
        fetch_runs(session, [current], dest, progress=False, quiet=True, streams=streams)
        if current["state"] not in ACTIVE:
            say(f"{run} is {current['state']}: fetched everything")
            return
        time.sleep(interval)


@task(help={"force": "destroy even if a run is running or a fetch failed",
            "streams": f"parallel SSH streams for the fetch (default {DEFAULT_STREAMS})", "stack": STACK_HELP})
def down(c, force=False, streams=None, stack=None):
    """Fetch every run, then stop billing (`pulumi destroy --yes` on GCP stacks, the data disks too).

    Refuses, naming the runs, while a run is still running or a fetch failed, unless --force. The data
    disks are protected against a plain `pulumi destroy`; only here, after the fetch, are they released.
    """
    streams = _streams(streams)
    session = Session(stack)
    doc = cluster_status(session, "--summaries")
    runs = doc["runs"]
    running = [r["id"] for r in runs if r["state"] in ACTIVE]
    if running and not force:
        raise Exit(f"refusing: still running: {', '.join(running)} ({CLI} stop, or {CLI} down --force)", code=ExitStatus.FAILED)
    if doc.get("unreachable") and not force:
        raise Exit(f"refusing: cannot check every node ({'; '.join(doc['unreachable'])}); {CLI} down --force to go on",
                   code=ExitStatus.FAILED)
    failed = fetch_runs(session, runs, None, progress=False, streams=streams)
    session.close()
    if failed and not force:
        raise Exit(f"refusing: fetch failed for {', '.join(failed)}; nothing was destroyed ({CLI} down --force to lose them)",
                   code=ExitStatus.FAILED)
    say(f"fetched {len(runs) - len(failed)} run(s) into runs/{session.target.stack}/")
    if not session.target.is_gcp:
        print(f"stack {session.target.stack} is an SSH stack: nothing to destroy")
        return
    from infra.ops import pulumi_cli
    from remote.ssh import target as targets

    try:  # the data disks are protected against a plain `pulumi destroy`; their runs are home now
        released = pulumi_cli.release_data_disks(session.target.stack)
    except RuntimeError as e:
        raise Exit(f"{e}; nothing was destroyed", code=ExitStatus.FAILED) from None
    if released:
        say(f"data disk(s) {', '.join(released)} released: their runs are in runs/{session.target.stack}/")
    from gpu_train.stack import stackfile
    from gpu_train.stack.project import pulumi_config_args

    where = pulumi_config_args(stackfile.stack_file(session.target.stack))  # a stack file in the user's project
    result = subprocess.run(["pulumi", "destroy", "--yes", "--stack", session.target.stack, *where], cwd=targets.REPO)
    if result.returncode != 0:
        raise Exit("pulumi destroy failed: the VM may still be billing; run `pulumi destroy` yourself", code=ExitStatus.FAILED)
    (session.target.cache / "outputs.json").unlink(missing_ok=True)
