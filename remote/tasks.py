"""The fab tasks: train, logs, status, stop, fetch, down, ssh, gpus, tunnel.

Each task resolves the stack's target, opens one SSH connection, and does its remote work in one
agent call (plus rsync for bulk data). Heavy imports (Fabric, paramiko) happen inside the tasks so
that `fab --list` stays fast.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from invoke import Collection, Exit, task

from gpu_train.config import ConfigError

STACK_HELP = "stack name (default: $GPU_TRAIN_STACK, else Pulumi's selected stack)"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Session:
    """One node of a stack's target and one open connection to it, reconnecting on demand."""

    def __init__(self, stack: str | None, timeout: float | None = None, node: int = 0, cluster=None):
        from remote import target as targets

        if cluster is None:
            try:
                cluster = targets.resolve(stack)
            except ConfigError as e:
                raise Exit(str(e), code=2) from None
        if not 0 <= node < len(cluster.hosts):
            raise Exit(f"--node {node}: the stack has nodes 0 to {len(cluster.hosts) - 1}", code=2)
        self.cluster = cluster
        self.target = cluster.for_node(node)
        self.node = node
        self.timeout = timeout if timeout is not None else (600.0 if self.target.is_gcp else 15.0)
        self.conn = None

    def nodes(self) -> list[Session]:
        """A session for every node of the cluster (this one for its own node)."""
        return [self if i == self.node else Session(None, self.timeout, i, self.cluster) for i in range(len(self.cluster.hosts))]

    def connect(self, again: bool = False):
        from remote import ssh
        from remote import target as targets

        if self.conn is not None:
            return self.conn
        from remote import vmprobe

        try:
            self.conn = ssh.open_connection(self.target, self.target.host, self.timeout, say,
                                            vmprobe.probe(self.target.stack, self.target.vm, say), again)
        except ssh.HostKeyError as e:
            raise Exit(str(e), code=3) from None
        except ssh.RemoteError as e:
            if not self.target.is_gcp:
                raise Exit(str(e), code=3) from None
            # The VM may have a new address (stopped and started): refresh the stack outputs once.
            self.cluster = targets.resolve(self.target.stack, refresh=True)
            self.target = self.cluster.for_node(self.node)
            try:
                self.conn = ssh.open_connection(self.target, self.target.host, self.timeout, say)
            except ssh.RemoteError as e2:
                raise Exit(f"{e2}\nIf the VM was stopped (idle auto-stop, maxRunHours, or running: false), start it: "
                           f"pulumi up --refresh --stack {self.target.stack} (with gpu-train:running true)", code=3) from None
        return self.conn

    def reconnect(self):
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        return self.connect(again=True)

    def call(self, *args: str) -> dict:
        from remote import ssh

        try:
            return ssh.call(self.connect(), self.target, *args)
        except ssh.RemoteError as e:
            raise Exit(str(e), code=1) from None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def on_every_node(sessions: list[Session], work) -> list[object]:
    """``work(session)`` on each node at once; results (or the Exit raised) in node order."""
    import threading

    results: list[object] = [None] * len(sessions)

    def run(i: int) -> None:
        try:
            results[i] = work(sessions[i])
        except Exit as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(sessions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _failures(results: list[object]) -> list[str]:
    return [f"node {i}: {r.message}" for i, r in enumerate(results) if isinstance(r, Exit)]


# -- train ------------------------------------------------------------------------------------
@task(
    iterable=["env"],
    help={
        "script": "Python file in --dir to run (gets --job-dir JOB_DIR appended)",
        "command": "shell command to run in the synced code instead of --script",
        "dir": "code directory to sync (default: the project, the nearest directory up with stacks/ or .git)",
        "name": "run name; the run id is NAME_YYYYmmdd_HHMMSS (default: the script's name)",
        "args": "arguments for --script, as one quoted string",
        "env": "NAME=VALUE for the job's environment (repeatable)",
        "launcher": "torchrun (default for a multi-node --script) or none",
        "nproc": "processes per node under torchrun (default: the node's GPUs, or 1)",
        "port": "torchrun's master port on node 0 (default 29500)",
        "ps": "with --command on several nodes: the last N nodes are TF parameter servers",
        "stack": STACK_HELP,
        "timeout": "seconds to wait for SSH (and on GCP for the NVIDIA driver); default 600 on GCP, 15 on SSH stacks",
    },
)
def train(c, script=None, command=None, dir=None, name=None, args="", env=None, launcher=None, nproc=None, port=29500,
          ps=0, stack=None, timeout=None):
    """Sync code, install requirements.txt when it changed, launch the job under screen.

    The job sees JOB_DIR (write checkpoints there) and RUN_ID. It survives the SSH session; follow
    it with `fab logs --follow`, bring results home with `fab fetch`. On several nodes the code goes
    to all of them at once and each starts its part: torchrun with its --node_rank, or a --command
    with MASTER_ADDR, MASTER_PORT, NODE_RANK, NNODES, NPROC_PER_NODE, WORLD_SIZE and TF_CONFIG.
    """
    from gpu_train import jobs
    from gpu_train.project import project_root
    from remote import ssh, sync
    from remote.target import state_home

    code_dir = Path(dir).expanduser().resolve() if dir else project_root()
    if not code_dir.is_dir():
        raise Exit(f"--dir {code_dir}: no such directory", code=2)
    session = Session(stack, float(timeout) if timeout else None)
    cluster = session.cluster
    try:
        base = jobs.base_name(name, script, command)
        run = jobs.run_id(base, datetime.now())
        spec = jobs.job_spec(run=run, base=base, script=script, command=command, args=args, env=env or [],
                             python=cluster.python, expect_gpus=cluster.expect_gpus, code_dir=code_dir)
        chosen = jobs.choose_launcher(launcher, len(cluster.hosts), script)
        spec = dataclasses.replace(spec, launcher=chosen, nproc=int(nproc) if nproc else cluster.gpus_per_node)
        specs = jobs.node_specs(spec, [h.host for h in cluster.hosts], cluster.master_addr, int(port), int(ps))
    except jobs.JobError as e:
        raise Exit(str(e), code=2) from None
    with tempfile.TemporaryDirectory(prefix="gpu-train-") as scratch:
        try:
            plan = sync.plan_code(code_dir, Path(scratch), [(project_root() / "runs", "fetched results"),
                                                            (state_home(), None)])
        except ssh.RemoteError as e:
            raise Exit(str(e), code=2) from None
        pushed = PushedManifests(cluster.cache)
        unchanged = all(pushed.get(h, base) == plan.manifest for h in cluster.hosts)
        where = f" to {len(cluster.hosts)} nodes" if len(cluster.hosts) > 1 else ""
        say(("unchanged since the last run: " if unchanged else f"syncing{where} ") + plan.describe())
        if plan.left_out:
            say(sync.left_out_summary(list(plan.left_out)))
        if plan.bytes > sync.LARGE_SYNC_BYTES:
            say(f"warning: {sync.human(plan.bytes)} is a lot of code; put data and outputs in {sync.IGNORE_FILE}")
        sessions = session.nodes()
        answers = on_every_node(sessions, lambda s: _launch(s, plan, specs[s.node], unchanged))
    failed = _failures(answers)
    if failed:
        launched = [s for s, a in zip(sessions, answers, strict=True) if not isinstance(a, Exit)]
        on_every_node(launched, lambda s: s.call("stop", "--grace", "5", "--run", run))  # no half a cluster
        raise Exit("; ".join(failed), code=1)
    for h in cluster.hosts:
        pushed.set(h, base, plan.manifest)
    for s in sessions:
        s.close()
    first = answers[0]
    stack_opt = f" --stack {cluster.stack}"
    nodes = f" on {len(sessions)} nodes (node 0: {cluster.host})" if len(sessions) > 1 else f" on {cluster.host}"
    print(f"started {first['runId']}{nodes} ({first['python']}); JOB_DIR={first['jobDir']}")
    print(f"  follow:  fab logs{stack_opt} --follow" + (" [--node N | --all]" if len(sessions) > 1 else ""))
    print(f"  status:  fab status{stack_opt}")
    print(f"  fetch:   fab fetch{stack_opt} --run {first['runId']}")


def _launch(session: Session, plan, spec, unchanged: bool) -> dict:
    """Sync (over the node's own connection) and launch one node's part; waits for the driver on GCP."""
    from gpu_train import jobs
    from remote import ssh, sync
    from remote.relay import ChannelRelay

    target = session.target
    spec = dataclasses.replace(spec, code_manifest=plan.manifest, reuse_code=unchanged,
                               agent_settings=target.agent_settings)
    conn = session.connect()
    with ChannelRelay(conn.transport) as relay:
        def push() -> None:
            sync.push_code(target, target.host, plan, spec.run_id, spec.base, rsh=relay.rsh())

        deadline, delay = time.monotonic() + session.timeout, 5.0
        while True:
            try:
                answer = ssh.launch(conn, target, jobs.encode_spec(spec), push, reuse=unchanged)
            except ssh.RemoteError as e:
                raise Exit(str(e), code=1) from None
            if "waiting" not in answer:
                return answer
            push = None  # the code is staged on the host; only the launch is retried
            if time.monotonic() > deadline:
                raise Exit(f"gave up after {session.timeout:g} s waiting for {answer['waiting']}", code=1)
            say(f"{target.host}: waiting for {answer['waiting']} (the driver installs on first boot, 3-5 minutes)")
            time.sleep(delay)
            delay = min(delay * 1.5, 30)


class PushedManifests:
    """Which code (by manifest) each host last received for a run name: a local cache, so an
    unchanged tree is launched without a sync; the host checks the claim before trusting it."""

    def __init__(self, cache: Path):
        self.path = cache / "code-manifests.json"

    def _load(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def get(self, host, base: str) -> str | None:
        return self._load().get(f"{host}/{base}")

    def set(self, host, base: str, manifest: str) -> None:
        doc = {**self._load(), f"{host}/{base}": manifest}
        _atomic_write(self.path, json.dumps(doc, indent=1))


# -- logs -------------------------------------------------------------------------------------
@task(help={"run": "run id (default: the newest)", "follow": "stream until the job ends; exit with its exit code",
            "lines": "show the last N lines first (default 50; 0 for the whole log)", "node": "which node (default 0)",
            "all": "every node's log, each line prefixed with its node", "stack": STACK_HELP})
def logs(c, run=None, follow=False, lines=50, node=0, all_=False, stack=None):
    """Show a run's log; with --follow, stream it (reconnecting if the connection drops)."""
    session = Session(stack, node=int(node))
    out = sys.stdout.buffer
    if not all_:
        trailer = _stream_log(session, run, int(lines), follow, out.write, out.flush)
        session.close()
        if follow:
            _exit_with(trailer)
        return
    import threading

    lock = threading.Lock()

    def prefixed(s: Session):
        pending = b""

        def write(data: bytes) -> None:
            nonlocal pending
            *complete, pending = (pending + data).split(b"\n")
            with lock:
                for line in complete:
                    out.write(f"[node {s.node}] ".encode() + line + b"\n")
                out.flush()

        return write

    sessions = session.nodes()
    trailers = on_every_node(sessions, lambda s: _stream_log(s, run, int(lines), follow, prefixed(s), out.flush))
    if failed := _failures(trailers):
        raise Exit("; ".join(failed), code=1)
    if follow:
        bad = [t for t in trailers if t["state"] != "succeeded"]
        _exit_with(bad[0] if bad else trailers[0])


def _stream_log(session: Session, run: str | None, lines: int, follow: bool, write, flush) -> dict | None:
    """One node's log from the agent, resuming at the right byte after a dropped connection."""
    from gpu_train.jobs import agent_command
    from remote import ssh

    offset: int | None = None
    received = 0

    def counted(data: bytes) -> None:
        nonlocal received
        received += len(data)
        write(data)
        flush()

    while True:
        args = ["logs"] + (["--run", run] if run else []) + (["--follow"] if follow else [])
        args += ["--offset", str(offset)] if offset is not None else (["--lines", str(lines)] if lines else [])
        received = 0
        try:
            status, err = ssh.stream(session.connect(), agent_command(session.target.remote_root, *args), counted)
        except (OSError, EOFError) as e:
            status, err = -1, str(e)
        start = ssh.start_offset(err)
        trailer = ssh.end_trailer(err)
        if trailer is not None:
            return trailer
        if status not in (-1, 0) and "GPU-TRAIN-START" not in err:
            raise Exit(_agent_error(err), code=1)
        if not follow:
            raise Exit(f"the connection dropped: {err.strip()}", code=1)
        if start is not None:
            offset = start + received
        say(f"{session.target.host}: connection lost; reconnecting ...")
        session.reconnect()


def _exit_with(trailer: dict) -> None:
    """End `fab logs --follow` with the job's own exit code."""
    state, code = trailer["state"], trailer["exitCode"]
    say(f"{trailer['runId']}: {state}" + (f", exit code {code}" if code is not None else ""))
    if code:
        raise Exit(code=code if 0 < code < 256 else 1)
    if state != "succeeded":
        raise Exit(code=1)


def _agent_error(err: str) -> str:
    for line in reversed(err.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line).get("error", line)
            except ValueError:
                pass
    return err.strip() or "the log could not be read"


# -- status -----------------------------------------------------------------------------------
def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def render_status(doc: dict, target) -> str:
    lines = [f"stack {target.stack}: {target.host} ({doc.get('host')}), root {doc.get('root')}"]
    if target.is_gcp and doc.get("uptimeS") is not None:
        hours = doc["uptimeS"] / 3600
        cost = f", about ${hours * target.hourly_cost_usd:,.2f} so far" if target.hourly_cost_usd else ""
        lines.append(f"VM up {hours:.1f} h{cost}")
    lines += agent_lines(doc, target)
    for g in doc.get("gpus", []):
        lines.append(f"GPU {g['index']} {g['name']}: {g['utilization']:.0f}% busy, "
                     f"{g['memoryUsedMiB']:.0f}/{g['memoryTotalMiB']:.0f} MiB")
    lines += [f"unreachable: {u}" for u in doc.get("unreachable", [])]
    runs = doc.get("runs", [])
    if not runs:
        lines.append("no runs yet: fab train --script train.py")
    for r in runs:
        state = r["state"] + (f" (exit {r['exitCode']})" if r["state"] == "failed" and r.get("exitCode") is not None else "")
        notes = []
        if r.get("resumes"):
            notes.append(f"resumed {r['resumes']}x")
        if r.get("preemptions"):
            notes.append(f"preempted {r['preemptions']}x")
        if r.get("reason"):
            notes.append(r["reason"])
        if r.get("detail"):
            notes.append(r["detail"])
        if notes:
            state += " [" + "; ".join(notes) + "]"
        lines.append(f"  {r['id']:<40} {state:<18} {_duration(r.get('durationS')):>8}  {r.get('lastLine', '')[:80]}")
    return "\n".join(lines)


def agent_lines(doc: dict, target) -> list[str]:
    """The on-host agent's view: idle clock, run-time cap."""
    agent = doc.get("agent") or {}
    lines = []
    minutes = agent.get("idleStopMinutes") or 0
    if minutes and agent.get("idleWhy"):
        lines.append(f"idle stop: {agent['idleWhy']}")
    elif minutes:
        lines.append(f"idle stop after {minutes} min (not checked yet: the agent's timer runs every minute)")
    else:
        lines.append("idle stop: off")
    hours = agent.get("maxRunHours")
    if hours and doc.get("uptimeS") is not None:
        left = hours - doc["uptimeS"] / 3600
        lines.append(f"run-time cap {hours} h: the VM stops in {max(left, 0):.1f} h")
    return lines


def cluster_status(session: Session, *args: str) -> dict:
    """The agent's status from every node, one state per run (a single node's document as it is)."""
    from gpu_train.jobs import aggregate_runs

    sessions = session.nodes()
    docs = on_every_node(sessions, lambda s: s.call("status", *args))
    for s in sessions:
        if s is not session:
            s.close()
    if len(docs) == 1:
        if isinstance(docs[0], Exit):
            raise docs[0]
        return docs[0]
    doc = aggregate_runs([None if isinstance(d, Exit) else d for d in docs])
    doc["unreachable"] = _failures(docs)
    return doc


@task(help={"json": "print JSON: runs[].{id, state, exitCode, jobDir, ...}", "stack": STACK_HELP})
def status(c, json_=False, stack=None):
    """Every run with its state, duration and last log line; GPU use; hours and cost on GCP.

    On several nodes a run is failed if any node failed (and says which), running while any runs.
    """
    session = Session(stack)
    doc = cluster_status(session)
    if json_:
        print(json.dumps({"stack": session.target.stack, **doc}, indent=1))
    else:
        print(render_status(doc, session.cluster))


# -- stop -------------------------------------------------------------------------------------
@task(help={"run": "run id (default: the newest)", "grace": "seconds between SIGINT, SIGTERM and SIGKILL (default 10)",
            "stack": STACK_HELP})
def stop(c, run=None, grace=10, stack=None):
    """Stop a run on every node: SIGINT, a grace period, SIGTERM, another, then SIGKILL of its process group."""
    session = Session(stack)
    sessions = session.nodes()
    args = ["stop", "--grace", str(float(grace))] + (["--run", run] if run else [])
    docs = on_every_node(sessions, lambda s: s.call(*args))
    for s, doc in zip(sessions, docs, strict=True):
        s.close()
        where = f"node {s.node}: " if len(sessions) > 1 else ""
        if not isinstance(doc, Exit):
            print(f"{where}{doc['runId']}: {doc['state']} ({', '.join(doc['signals']) or 'no signal needed'})")
    if failed := _failures(docs):
        raise Exit("; ".join(failed), code=1)


@task(help={"run": "run id (default: the newest)", "grace": "seconds to let a still-running part stop (default 10)",
            "stack": STACK_HELP})
def resume(c, run=None, grace=10, stack=None):
    """Restart a run on every node with the same RUN_ID and JOB_DIR, so it carries on from its newest
    checkpoint: after a node of a cluster was preempted, or a run failed for a reason now fixed."""
    session = Session(stack)
    sessions = session.nodes()
    if not run:
        runs = session.call("status")["runs"]
        if not runs:
            raise Exit("no runs on this host yet", code=1)
        run = runs[-1]["id"]
    docs = on_every_node(sessions, lambda s: s.call("resume", "--run", run, "--grace", str(float(grace))))
    for s in sessions:
        s.close()
    if failed := _failures(docs):
        raise Exit("; ".join(failed), code=1)
    print(f"{run}: restarted on {len(sessions)} node(s) (resume {docs[0]['resumes']})")


# -- fetch and down ---------------------------------------------------------------------------
def local_summary(path: Path) -> dict:
    files = size = newest = 0
    for p in path.rglob("*") if path.is_dir() else []:
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            files, size, newest = files + 1, size + st.st_size, max(newest, st.st_mtime_ns)
    return {"files": files, "bytes": size, "newestNs": newest}


class FetchRecord:
    """What each run's JOB_DIR looked like, on the host and here, after its last complete fetch.

    When both are unchanged there is nothing to fetch, and no rsync is started.
    """

    def __init__(self, cache: Path):
        self.path = cache / "fetched.json"
        try:
            self.doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.doc = {}

    @staticmethod
    def _entry(run: dict, dest: Path) -> dict:
        return {"run": run["id"], "dest": str(dest.resolve()), "remote": run.get("jobSummary"),
                "local": local_summary(dest)}

    def up_to_date(self, run: dict, dest: Path) -> bool:
        seen = self.doc.get(str(dest.resolve()))
        return bool(seen) and run.get("jobSummary") is not None and seen == self._entry(run, dest)

    def record(self, run: dict, dest: Path) -> None:
        self.doc[str(dest.resolve())] = self._entry(run, dest)
        _atomic_write(self.path, json.dumps(self.doc, indent=1))


def runs_home() -> Path:
    """Where fetched runs go by default: runs/ in the project (never synced back as code)."""
    from gpu_train.project import project_root

    return project_root() / "runs"


def _fetch_runs(session: Session, runs: list[dict], dest: str | None, progress: bool, quiet: bool = False,
                subdir: str = "") -> list[str]:
    """Fetch each run's JOB_DIR (into ``subdir`` of the run's folder); the ids that failed."""
    from remote import ssh, sync

    record = FetchRecord(session.target.cache)
    failed = []
    for r in runs:
        where = Path(dest) / r["id"] if dest and len(runs) > 1 else Path(dest or runs_home() / session.target.stack / r["id"])
        where = where / subdir if subdir else where
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
            "stack": STACK_HELP})
def fetch(c, run=None, all_=False, dest=None, watch=False, interval=30, all_nodes=False, stack=None):
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
    if run and not all_ and not fetched_before and ssh.knows_host(target, target.host):
        # A first fetch of a named run: rsync alone, no agent call (OpenSSH checks the known host key).
        job = f"{target.rsync_root()}/runs/{run}/job"
        runs = [{"id": run, "state": "unknown", "jobDir": job}]
    else:
        doc = session.call("status", "--summaries", *(["--run", run] if run and not all_ else []))
        runs = doc["runs"] if (all_ or run) else doc["runs"][-1:]
    if not runs:
        raise Exit("no runs on this host yet", code=1)
    failed = _fetch_runs(session, runs, dest, progress=sys.stdout.isatty())
    session.close()
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
        return _fetch_runs(s, runs, dest, progress=False, subdir=f"node-{s.node}")

    results = on_every_node(sessions, one)
    for s in sessions:
        s.close()
    failed = _failures(results) + [f"node {i}" for i, r in enumerate(results) if isinstance(r, list) and r]
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
        _fetch_runs(session, [current], dest, progress=False, quiet=True)
        if current["state"] not in ("starting", "running"):
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
    running = [r["id"] for r in runs if r["state"] in ("starting", "running")]
    if running and not force:
        raise Exit(f"refusing: still running: {', '.join(running)} (fab stop, or fab down --force)", code=1)
    if doc.get("unreachable") and not force:
        raise Exit(f"refusing: cannot check every node ({'; '.join(doc['unreachable'])}); fab down --force to go on",
                   code=1)
    failed = _fetch_runs(session, runs, None, progress=False)
    session.close()
    if failed and not force:
        raise Exit(f"refusing: fetch failed for {', '.join(failed)}; nothing was destroyed (fab down --force to lose them)",
                   code=1)
    say(f"fetched {len(runs) - len(failed)} run(s) into runs/{session.target.stack}/")
    if not session.target.is_gcp:
        print(f"stack {session.target.stack} is an SSH stack: nothing to destroy")
        return
    from remote import target as targets

    result = subprocess.run(["pulumi", "destroy", "--yes", "--stack", session.target.stack], cwd=targets.REPO)
    if result.returncode != 0:
        raise Exit("pulumi destroy failed: the VM may still be billing; run `pulumi destroy` yourself", code=1)
    (session.target.cache / "outputs.json").unlink(missing_ok=True)


# -- setup --------------------------------------------------------------------------------------
@task(help={"stack": STACK_HELP})
def setup(c, stack=None):
    """Install the on-host agent with the stack's settings; on SSH stacks also `boot` at reboot.

    GCP VMs get this from their startup script. On an SSH host, `boot` is added to your crontab
    (@reboot) so runs a reboot interrupted carry on; power-off when idle stays off unless the stack
    sets gpu-train:idleStopMinutes (then `tick` runs every minute, and must be allowed to power off).
    """
    import base64

    session = Session(stack)
    encoded = base64.b64encode(json.dumps(session.target.agent_settings).encode()).decode()
    doc = session.call("configure", encoded, *([] if session.target.is_gcp else ["--cron"]))
    session.close()
    print(f"agent settings on {session.target.host}: {json.dumps(doc['settings'])}")
    for line in doc.get("crontab", []):
        print(f"crontab: {line}")


# -- ssh, gpus, tunnel ------------------------------------------------------------------------
def write_ssh_config(target, home: Path | None = None) -> str:
    """An ssh_config entry `gpu-train-STACK` (so ssh, rsync and editors' remote-SSH work), included
    from ~/.ssh/config. Returns the host alias."""
    from remote import sshalias
    from remote import target as targets
    from remote.ssh import proxy_command

    alias = f"gpu-train-{target.stack}"
    h = target.host
    entry = sshalias.entry(target.stack, [(h.user, h.host, h.port)], target.key_file, str(target.known_hosts), False,
                           [proxy_command(target, h)])
    conf = targets.state_home() / "ssh_config.d" / f"{alias}.conf"
    _atomic_write(conf, entry)
    user_conf = (home or Path.home()) / ".ssh" / "config"
    include = f"Include {conf.parent}/*.conf"
    existing = user_conf.read_text() if user_conf.exists() else ""
    if include not in existing:
        user_conf.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _atomic_write(user_conf, f"{include}\n{existing}")  # Include must come before any Host block
    return alias


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    if path.exists():
        os.chmod(tmp, path.stat().st_mode & 0o777)
    tmp.replace(path)


def _exec_ssh(session: Session, *extra: str, command: str | None = None) -> None:
    from remote import ssh

    session.connect()  # verifies (or learns) the host key first
    session.close()
    h = session.target.host
    argv = ["ssh", *ssh.openssh_options(session.target, h), *extra, f"{h.user}@{h.host}", *([command] if command else [])]
    os.execvp("ssh", argv)


@task(help={"command": "run this command instead of a shell (also: gpu-train ssh -- CMD)", "stack": STACK_HELP})
def ssh(c, command=None, stack=None):
    """A shell on the host (or one command: `ssh -- nvidia-smi`); also writes the ssh config entry gpu-train-STACK."""
    session = Session(stack)
    if command:
        _exec_ssh(session, *(["-t"] if sys.stdin.isatty() else []), command=command)
    alias = write_ssh_config(session.target)
    say(f"ssh config entry: {alias} (ssh {alias}, rsync -e ssh ... {alias}:path)")
    _exec_ssh(session, "-t")


ssh.remainder_kwarg = "command"  # `gpu-train ssh -- CMD` (remote/cli.py's Executor)


@task(help={"stack": STACK_HELP})
def gpus(c, stack=None):
    """nvidia-smi on the host."""
    session = Session(stack)
    result = session.connect().run("command -v nvidia-smi >/dev/null && nvidia-smi || echo 'no nvidia-smi on this host'",
                                   warn=True, in_stream=False)
    session.close()
    if result.exited:
        raise Exit(code=result.exited)


@task(help={"port": "remote port (default 6006, TensorBoard)", "local_port": "local port (default: the same)",
            "stack": STACK_HELP})
def tunnel(c, port=6006, local_port=None, stack=None):
    """Forward localhost:LOCAL_PORT to the host's localhost:PORT over SSH (no firewall change)."""
    session = Session(stack)
    port, local = int(port), int(local_port or port)
    say(f"http://localhost:{local} -> {session.target.host} localhost:{port} (Ctrl-C to stop)")
    _exec_ssh(session, "-N", "-o", "ExitOnForwardFailure=yes", "-L", f"{local}:localhost:{port}")


from remote.starter import init  # noqa: E402  (gpu-train init)

ns = Collection(train, logs, status, stop, resume, fetch, down, setup, ssh, gpus, tunnel, init)
