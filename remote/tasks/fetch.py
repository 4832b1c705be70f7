"""`fab fetch` and `fab down`: bring JOB_DIRs home (once, or while a run trains), then stop billing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import cast

from invoke import task

from gpu_train.contract import ACTIVE
from gpu_train.environment import Environment
from gpu_train.errors import CommandFailed, ExitStatus, GpuTrainError, Unreachable, UsageError
from remote.tasks import frombucket, trust
from remote.tasks.frombucket import destination, node_dir
from remote.tasks.localstate import FetchRecord
from remote.tasks.session import CLI, STACK_HELP, Session, failures, on_every_node, say
from remote.transfer.fetch.generator import DEFAULT_STREAMS


def fetch_runs(
    session: Session,
    runs: list[dict],
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
    from remote.ssh import hostkeys
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
    if not hostkeys.knows_host(session.target, session.target.host):
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
        problems += lost + (newer if strict else [])
        if not lost and not newer:
            record.record(r, where)
    record.save()
    if not quiet or any(res.files for res in results):
        say(fetch_report.summary_line(results, bar.elapsed, streams, runs=len(todo)))
    return problems


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
        unreachable = all(r.unreachable for r in results)
        if unreachable and (attempt == 2 or not session.target.is_gcp):  # (a stack with a bucket fetches from it)
            raise Unreachable(f"cannot reach {session.target.host} over SSH ({results[0].error})")
        if attempt == 2 or not unreachable or not session.target.is_gcp:
            return results
        session.reconnect()  # refreshes the stack outputs when the VM moved
    return results


@task(
    help={
        "run": "run id (default: the newest)",
        "all": "every run",
        "dest": "where to (default runs/STACK/RUN/)",
        "watch": "keep fetching new checkpoints until the run ends",
        "interval": "seconds between --watch rounds (30)",
        "node": "which node (default 0; node N's files go into RUN/node-N/)",
        "all_nodes": "every node's files (node N's into RUN/node-N/; default: node 0's, where checkpoints are written)",
        "streams": f"parallel SSH streams (default {DEFAULT_STREAMS}; 1 for a single stream)",
        "json": "print what was fetched where as JSON",
        "stack": STACK_HELP,
        "from": "`bucket`: from the stack's gpu-train:bucket instead of the host (also used by itself when the host cannot be reached)",
    }
)
def fetch(
    c,
    run=None,
    all_=False,
    dest=None,
    watch=False,
    interval=None,
    node=None,
    all_nodes=False,
    streams=None,
    stack=None,
    json_=False,
    from_=None,
):
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
    streams = _streams(streams)
    run, interval = trust.run_option(run), trust.number("--interval", 30 if interval is None else interval, float, 0)
    if from_ not in (None, "host", "bucket"):
        raise UsageError(f"--from {from_}: `host` (the default) or `bucket`")
    session = Session(Environment.of(c), stack, node=trust.number("--node", node or 0, int, 0), probe_shared=True)
    if from_ == "bucket":
        frombucket.from_bucket(session.env, session.cluster, run, all_, dest, streams)
        return
    followed: dict[str, str] = {}  # the run --watch follows, once known
    try:
        _fetch_from_host(session, run, all_, dest, watch, interval, all_nodes, streams, json_, followed)
    except GpuTrainError as e:
        if e.status != ExitStatus.UNREACHABLE or not session.cluster.bucket:
            raise
        every = " (every node's files: node N's in node-N/)" if all_nodes or len(session.cluster.hosts) > 1 else ""
        say(f"{e}\nthe host cannot be reached: fetching from the bucket {session.cluster.bucket} instead{every}")
        frombucket.from_bucket(session.env, session.cluster, followed.get("run", run), all_, dest, streams)
        if watch:
            raise Unreachable(
                "--watch: fetched what the bucket holds now, but not watching: only the host knows whether the "
                f"run still trains. Run `{CLI} fetch --watch` again once it can be reached"
            ) from None


def _fetch_from_host(session: Session, run, all_, dest, watch, interval, all_nodes, streams, json_, followed: dict[str, str]) -> None:
    if watch:
        if all_nodes:
            raise UsageError("--watch follows one node: give --node N (default 0), not --all-nodes")
        _watch(session, run, dest, interval, streams, followed)
        return
    sessions = session.nodes() if all_nodes else [session]
    if len(sessions) > 1 and not all_ and run is None:  # the newest run is node 0's, fetched from every node
        lead = session.call("status")["runs"]
        if not lead:
            raise GpuTrainError("no runs on this host yet")
        run = lead[-1]["id"]

    def one(s: Session) -> tuple[list[dict], list[str]]:
        runs = _which_runs(s, run, all_)
        return runs, fetch_runs(
            s, runs, dest, progress=s.env.stderr_isatty and not json_ and len(sessions) == 1, subdir=node_dir(s.node), streams=streams
        )

    results: list[object] = on_every_node(sessions, one) if len(sessions) > 1 else [one(session)]
    for s in sessions:
        s.close()
    results = frombucket.gone_nodes(session, sessions, results, run, all_, dest, streams)
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
    if json_:
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


def _which_runs(session: Session, run: str | None, all_: bool) -> list[dict]:
    """The runs to fetch from a node: a named one, a prefix the host resolves, every run, or the newest."""
    if run and not all_ and re.search(r"_\d{8}_\d{6}$", run) is None:  # a prefix or a base name: the host knows
        runs = session.call("status", "--summaries", "--run", run)["runs"]
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
        doc = session.call("status")
        runs = doc["runs"] if all_ else doc["runs"][-1:]
    if not runs:
        raise GpuTrainError("no runs on this host yet")
    return runs


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
        raise UsageError(f"--streams {value}: a number of parallel SSH streams from 1 to 64 (default {DEFAULT_STREAMS})")
    return n


def _watch(session: Session, run: str | None, dest: str | None, interval: float, streams: int, followed: dict[str, str]) -> None:
    """Fetch a run's new files every ``interval`` seconds until it ends, then once more (``followed``
    names the run from its first answer on: the bucket's fallback takes that one)."""
    while True:
        doc = session.call("status", "--summaries", *(["--run", run] if run else []))
        if not doc["runs"]:
            raise GpuTrainError("no runs on this host yet")
        current = doc["runs"][-1]
        run = followed["run"] = current["id"]
        problems = fetch_runs(session, [current], dest, progress=False, quiet=True, streams=streams, subdir=node_dir(session.node))
        if current["state"] not in ACTIVE:
            if problems:
                raise GpuTrainError(f"{run} is {current['state']}, but not everything is home:\n  " + "\n  ".join(problems))
            say(f"{run} is {current['state']}: fetched everything")
            return
        session.close()  # the next round's first call checks the shared connection again (a host gone meanwhile)
        time.sleep(interval)


def every_node_status(session: Session) -> tuple[list[Session], list[object]]:
    """Every node's session and its status document with summaries (the error of a node that failed)."""
    sessions = session.nodes()
    return sessions, on_every_node(sessions, lambda s: s.call("status", "--summaries"))


def guard_runs(sessions: list[Session], docs: list[object]) -> tuple[list[dict], list[str]]:
    """The cluster's runs (one state each) and the nodes that could not be asked, for the guards."""
    from gpu_train.jobs import aggregate_runs

    if len(docs) == 1 and not isinstance(docs[0], GpuTrainError):
        return cast(dict, docs[0])["runs"], []
    doc = aggregate_runs([None if isinstance(d, GpuTrainError) else cast(dict, d) for d in docs])
    return doc["runs"], failures(docs)


def fetch_every_node(sessions: list[Session], docs: list[object], streams: int = DEFAULT_STREAMS) -> list[str]:
    """Before anything is destroyed: every node's runs home (node N's in RUN/node-N/), strictly (a host's
    file the laptop kept its newer copy of counts as not home). What is not, one line each."""

    def one(s: Session) -> list[str]:
        runs = cast(dict, docs[s.node])["runs"]
        lost = fetch_runs(s, runs, None, progress=False, subdir=node_dir(s.node), streams=streams, strict=True) if runs else []
        return [f"node {s.node}: {m}" for m in lost] if len(sessions) > 1 else lost

    results = on_every_node([s for s in sessions if not isinstance(docs[s.node], GpuTrainError)], one)
    return failures(results) + [m for r in results if isinstance(r, list) for m in r]


def refusal(problems: list[str], what: str, force_hint: str) -> str:
    """The guards' message: what would be lost, and the ways on."""
    shown = "\n  ".join(problems[:20]) + (f"\n  and {len(problems) - 20} more" if len(problems) > 20 else "")
    return (
        f"refusing: not everything is home; nothing was {what}. What would be lost:\n  {shown}\n"
        f"Fix what is named and run it again, or {force_hint} to lose them"
    )


def uncron(session: Session) -> None:
    """`down` on an SSH stack: each host's @reboot line (reboot-resume, from `setup`) goes too."""
    nodes = session.nodes()
    results = on_every_node(nodes, lambda s: s.call("uncron"))
    for s, r in zip(nodes, results, strict=True):
        if isinstance(r, dict) and r.get("removed"):
            say(f"{s.target.host}: took gpu-train's lines out of your crontab (reboots no longer resume runs there)")
    for line in failures(results):
        say(f"warning: {line}: gpu-train's crontab lines may still be there (`crontab -e` there to remove them)")


@task(
    help={
        "force": "destroy even if a run is running or not everything could be fetched (naming what is lost)",
        "streams": f"parallel SSH streams for the fetch (default {DEFAULT_STREAMS})",
        "stack": STACK_HELP,
        "no_fetch": "with gpu-train:bucket: download nothing; refuses unless every run is verified in the bucket",
    }
)
def down(c, force=False, streams=None, stack=None, no_fetch=False):
    """Fetch every run from every node, then stop billing (`pulumi destroy --yes` on GCP stacks, the data disks too).

    Refuses, naming what would be lost, while a run is still running or anything of any node (a JOB_DIR,
    the outputs in a working directory) is not home, unless --force. The data disks are protected
    against a plain `pulumi destroy`; only here, after the fetch, are they released.
    """
    streams = _streams(streams)
    session = Session(Environment.of(c), stack)
    sessions, docs = every_node_status(session)
    if len(docs) == 1 and isinstance(docs[0], GpuTrainError):
        raise docs[0]
    runs, unreachable = guard_runs(sessions, docs)
    running = [r["id"] for r in runs if r["state"] in ACTIVE]
    if running and not force:
        raise GpuTrainError(f"refusing: still running: {', '.join(running)} ({CLI} stop, or {CLI} down --force)")
    if unreachable and not force:
        raise GpuTrainError(f"refusing: cannot check every node ({'; '.join(unreachable)}); {CLI} down --force to go on")
    bucket = session.target.bucket
    if no_fetch:
        from remote.tasks.bucketguard import not_in_bucket

        if not bucket:
            raise UsageError(f"--no-fetch: stack {session.target.stack} has no gpu-train:bucket to keep its runs (docs/bucket.md)")
        problems = not_in_bucket([None if isinstance(d, GpuTrainError) else cast(dict, d) for d in docs])
    else:
        problems = [f"{u} (not fetched)" for u in unreachable] + fetch_every_node(sessions, docs, streams)
    for s in sessions:
        s.close()
    if problems and not force:
        raise GpuTrainError(
            refusal(problems, "destroyed", f"{CLI} down --force") + (f" (or {CLI} down, which downloads them)" if no_fetch else "")
        )
    if problems:
        say("--force: going on; lost with the host:\n  " + "\n  ".join(problems))
    say(
        f"every run is verified in {bucket}; nothing downloaded"
        if no_fetch
        else f"fetched {len(runs)} run(s) into runs/{session.target.stack}/"
    )
    if bucket:
        say(f"the bucket {bucket} and the runs in it stay (`{CLI} fetch --from bucket` brings one home)")
    if not session.target.is_gcp:
        print(f"stack {session.target.stack} is an SSH stack: nothing to destroy")
        uncron(session)
        return
    from infra.ops import pulumi_cli
    from remote.ssh import target as targets

    try:  # the data disks are protected against a plain `pulumi destroy`; their runs are home now
        released = pulumi_cli.release_data_disks(session.target.stack)
    except RuntimeError as e:
        raise GpuTrainError(f"{e}; nothing was destroyed") from None
    if released:
        say(f"data disk(s) {', '.join(released)} released: their runs are in {bucket if no_fetch else f'runs/{session.target.stack}/'}")
    from gpu_train.stack.project import pulumi_config_args

    where = pulumi_config_args(session.env.stack_file(session.target.stack))  # a stack file in the user's project
    result = subprocess.run(
        ["pulumi", "destroy", "--yes", "--stack", session.target.stack, *where],
        cwd=targets.REPO,
        env={**os.environ, **session.env.exported()},
    )
    if result.returncode != 0:
        raise CommandFailed(
            "pulumi destroy failed: the VM may still be billing; run `pulumi destroy` yourself",
            command="pulumi destroy",
            exited=result.returncode,
        )
    (session.target.cache / "outputs.json").unlink(missing_ok=True)
