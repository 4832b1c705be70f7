"""`fab fetch` and `fab down`: bring JOB_DIRs home (once, or while a run trains), then stop billing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from invoke import Exit, task

from gpu_train.project import project_root
from remote.agent.protocol import ACTIVE
from remote.tasks.localstate import FetchRecord
from remote.tasks.runs import cluster_status
from remote.tasks.session import STACK_HELP, Session, failures, on_every_node, say


def destination(stack: str, run: str, dest: str | None, several: bool, subdir: str = "") -> Path:
    """Where a run's JOB_DIR goes: --dest (RUN/ under it for several runs), else the project's runs/STACK/RUN."""
    where = Path(dest) / run if dest and several else Path(dest or project_root() / "runs" / stack / run)
    return where / subdir if subdir else where


def fetch_runs(session: Session, runs: list[dict], dest: str | None, progress: bool, quiet: bool = False,
                subdir: str = "") -> list[str]:
    """Fetch each run's JOB_DIR (into ``subdir`` of the run's folder); the ids that failed."""
    from remote import ssh, sync

    record = FetchRecord(session.target.cache)
    failed = []
    for r in runs:
        where = destination(session.target.stack, r["id"], dest, len(runs) > 1, subdir)
        if record.up_to_date(r, where):
            if not quiet:
                say(f"{r['id']}: up to date in {where}")
            continue
        say(f"fetching {r['id']} ({r['state']}) -> {where}")
        try:
            sync.fetch_dir(session.target, session.target.host, r["jobDir"], where, progress)
            record.record(r, where)
        except ssh.RemoteError as e:
            say(str(e))
            failed.append(r["id"])
    return failed


@task(help={"run": "run id (default: the newest)", "all": "every run", "dest": "where to (default runs/STACK/RUN/)",
            "watch": "keep fetching new checkpoints until the run ends", "interval": "seconds between --watch rounds (30)",
            "all_nodes": "each node's JOB_DIR into RUN/node-N/ (default: node 0's, where checkpoints are written)",
            "json": "print what was fetched where as JSON", "stack": STACK_HELP})
def fetch(c, run=None, all_=False, dest=None, watch=False, interval=30, all_nodes=False, stack=None, json_=False):
    """Bring a run's JOB_DIR home: incremental, resumable, each file complete and verified before use.

    With --watch it fetches while the run trains, so the laptop's copy trails by at most one checkpoint.
    """
    from remote import ssh

    session = Session(stack)
    target = session.target
    if watch:
        _watch(session, run, dest, float(interval))
        return
    if all_nodes:
        _fetch_every_node(session, run, dest)
        return
    fetched_before = any(v.get("run") == run for v in FetchRecord(target.cache).doc.values())
    whole_id = bool(run) and re.search(r"_\d{8}_\d{6}$", run) is not None  # not a prefix the host must resolve
    if run and whole_id and not all_ and not fetched_before and ssh.knows_host(target, target.host):
        # A first fetch of a named run: rsync alone, no agent call (OpenSSH checks the known host key).
        job = f"{target.rsync_root()}/runs/{run}/job"
        runs = [{"id": run, "state": "unknown", "jobDir": job}]
    else:
        doc = session.call("status", "--summaries", *(["--run", run] if run and not all_ else []))
        runs = doc["runs"] if (all_ or run) else doc["runs"][-1:]
    if not runs:
        raise Exit("no runs on this host yet", code=1)
    failed = fetch_runs(session, runs, dest, progress=sys.stdout.isatty() and not json_)
    session.close()
    if json_:
        print(json.dumps({"fetched": [{"runId": r["id"], "dest": str(destination(target.stack, r["id"], dest, len(runs) > 1))}
                                      for r in runs if r["id"] not in failed], "failed": failed}, indent=1))
    if failed:
        raise Exit(f"fetch failed for {', '.join(failed)}: run `fab fetch` again to resume", code=1)


def _fetch_every_node(session: Session, run: str | None, dest: str | None) -> None:
    sessions = session.nodes()
    lead = session.call("status", *(["--run", run] if run else []))["runs"]
    if not lead:
        raise Exit("no runs on this host yet", code=1)
    run_id = lead[-1]["id"]

    def one(s: Session) -> list[str]:
        runs = s.call("status", "--summaries", "--run", run_id)["runs"]
        return fetch_runs(s, runs, dest, progress=False, subdir=f"node-{s.node}")

    results = on_every_node(sessions, one)
    for s in sessions:
        s.close()
    failed = failures(results) + [f"node {i}" for i, r in enumerate(results) if isinstance(r, list) and r]
    if failed:
        raise Exit(f"fetch failed for {', '.join(failed)}: run `fab fetch --all-nodes` again to resume", code=1)


def _watch(session: Session, run: str | None, dest: str | None, interval: float) -> None:
    """Fetch a run's new files every ``interval`` seconds until it ends, then once more."""
    while True:
        doc = session.call("status", "--summaries", *(["--run", run] if run else []))
        if not doc["runs"]:
            raise Exit("no runs on this host yet", code=1)
        current = doc["runs"][-1]
        run = current["id"]
        fetch_runs(session, [current], dest, progress=False, quiet=True)
        if current["state"] not in ACTIVE:
            say(f"{run} is {current['state']}: fetched everything")
            return
        time.sleep(interval)


@task(help={"force": "destroy even if a run is running or a fetch failed", "stack": STACK_HELP})
def down(c, force=False, stack=None):
    """Fetch every run, then stop billing (`pulumi destroy --yes` on GCP stacks).

    Refuses, naming the runs, while a run is still running or a fetch failed, unless --force.
    """
    session = Session(stack)
    doc = cluster_status(session, "--summaries")
    runs = doc["runs"]
    running = [r["id"] for r in runs if r["state"] in ACTIVE]
    if running and not force:
        raise Exit(f"refusing: still running: {', '.join(running)} (fab stop, or fab down --force)", code=1)
    if doc.get("unreachable") and not force:
        raise Exit(f"refusing: cannot check every node ({'; '.join(doc['unreachable'])}); fab down --force to go on",
                   code=1)
    failed = fetch_runs(session, runs, None, progress=False)
    session.close()
    if failed and not force:
        raise Exit(f"refusing: fetch failed for {', '.join(failed)}; nothing was destroyed (fab down --force to lose them)",
                   code=1)
    say(f"fetched {len(runs) - len(failed)} run(s) into runs/{session.target.stack}/")
    if not session.target.is_gcp:
        print(f"stack {session.target.stack} is an SSH stack: nothing to destroy")
        return
    from gpu_train import config
    from gpu_train.project import pulumi_config_args
    from remote import target as targets

    where = pulumi_config_args(config.stack_file(session.target.stack))
    result = subprocess.run(["pulumi", "destroy", "--yes", "--stack", session.target.stack, *where], cwd=targets.REPO)
    if result.returncode != 0:
        raise Exit("pulumi destroy failed: the VM may still be billing; run `pulumi destroy` yourself", code=1)
    (session.target.cache / "outputs.json").unlink(missing_ok=True)
