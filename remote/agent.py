#!/usr/bin/env python3
"""gpu-train-agent: the on-host half of gpu-train. Standard library only; Python 3.8+.

The laptop sends this file with each task (compressed, on the command line) and runs one
subcommand, which answers with one JSON document on stdout: one SSH round trip per task. ``launch``
also installs it at REMOTE_ROOT/bin/gpu-train-agent, where the job wrapper (and reboot hooks) run it.

State on the host is the truth about runs:

    REMOTE_ROOT/
      bin/gpu-train-agent
      code/BASE.last -> ../runs/RUN/code   (the newest code of a name: rsync --link-dest)
      staging/RUN/                          (code being synced, before launch)
      runs/RUN/{code/, job/ (= JOB_DIR), log, state.json, spec.json}
      python/<hash>.requirements            (hash of the last requirements.txt installed per Python)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

TERMINAL = ("succeeded", "failed", "stopped")
LAUNCH_GRACE_S = 30
AGENT_SOURCE = globals().get("AGENT_SOURCE")  # set when the laptop runs us from the command line


# -- small helpers ----------------------------------------------------------------------------
def now() -> float:
    return round(time.time(), 3)


def write_json(path: str, doc: dict) -> None:
    """Atomically: a reader sees the old or the new document, never half of one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def update_state(run_dir: str, **changes: object) -> dict:
    path = os.path.join(run_dir, "state.json")
    state = read_json(path) or {}
    state.update(changes)
    write_json(path, state)
    return state


def proc_start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, to tell it from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return "alive"
        except OSError:
            return None


def alive(pid: int | None, started: str | None) -> bool:
    if not pid:
        return False
    now_start = proc_start_time(pid)
    return now_start is not None and (started in (None, "alive") or now_start == started)


@contextlib.contextmanager
def locked(root: str):
    """One launch at a time on a host, so two runs of one name cannot both start."""
    with open(os.path.join(root, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


class AgentError(Exception):
    pass


# -- runs -------------------------------------------------------------------------------------
def run_dirs(root: str) -> list[str]:
    runs = os.path.join(root, "runs")
    try:
        names = sorted(os.listdir(runs))
    except OSError:
        return []
    return [os.path.join(runs, n) for n in names if os.path.isfile(os.path.join(runs, n, "state.json"))]


def effective_state(state: dict) -> str:
    """The recorded state, corrected by what is alive: a 'running' run with no process was interrupted."""
    recorded = state.get("state", "starting")
    if recorded in TERMINAL or recorded == "interrupted":
        return recorded
    if alive(state.get("pid"), state.get("pidStart")) or alive(state.get("wrapperPid"), state.get("wrapperStart")):
        return recorded
    launching = recorded == "starting" and not state.get("wrapperPid")
    if launching and time.time() - state.get("created", 0) < LAUNCH_GRACE_S:
        return recorded  # screen is starting the wrapper, which records its pid first thing
    return "interrupted"


def last_line(path: str, limit: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            lines = [ln for ln in f.read().decode("utf-8", "replace").replace("\r", "\n").split("\n") if ln.strip()]
    except OSError:
        return ""
    return lines[-1][-200:] if lines else ""


def tree_summary(path: str) -> dict:
    """Files, bytes and newest change under ``path``: equal summaries mean nothing to fetch."""
    files = size = newest = 0
    for folder, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(folder, name))
                files, size, newest = files + 1, size + st.st_size, max(newest, st.st_mtime_ns)
    return {"files": files, "bytes": size, "newestNs": newest}


def describe(run_dir: str) -> dict:
    state = read_json(os.path.join(run_dir, "state.json")) or {}
    st = effective_state(state)
    end = state.get("ended") or (state.get("interruptedAt") if st == "interrupted" else None)
    start = state.get("started") or state.get("created")
    return {
        "id": os.path.basename(run_dir),
        "base": state.get("base"),
        "state": st,
        "exitCode": state.get("exitCode"),
        "created": state.get("created"),
        "started": state.get("started"),
        "ended": state.get("ended"),
        "durationS": round((end or time.time()) - start, 1) if start else None,
        "jobDir": os.path.join(run_dir, "job"),
        "log": os.path.join(run_dir, "log"),
        "lastLine": last_line(os.path.join(run_dir, "log")),
        "resumes": state.get("resumes", 0),
        "preemptions": state.get("preemptions", 0) + int(bool(state.get("preempted"))),
        "reason": state.get("reason"),
        "pid": state.get("pid"),
    }


def find_run(root: str, run_id: str | None) -> str:
    dirs = run_dirs(root)
    if run_id:
        path = os.path.join(root, "runs", run_id)
        if path in dirs:
            return path
        raise AgentError(f"no run {run_id!r} on this host (runs: {', '.join(os.path.basename(d) for d in dirs) or 'none'})")
    if not dirs:
        raise AgentError("no runs on this host yet: start one with `fab train`")
    return max(dirs, key=lambda d: (read_json(os.path.join(d, "state.json")) or {}).get("created", 0))


def gpus() -> list[dict]:
    """Per-GPU utilisation and memory from nvidia-smi, or [] where there is none."""
    if not shutil.which("nvidia-smi"):
        return []
    query = "index,name,utilization.gpu,memory.used,memory.total"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5:
            rows.append({"index": int(parts[0]), "name": parts[1], "utilization": float(parts[2]),
                         "memoryUsedMiB": float(parts[3]), "memoryTotalMiB": float(parts[4])})
    return rows


def gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def uptime_s() -> float | None:
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def detect_python(configured: str | None) -> str:
    """The job's Python: configured, else the DLVM's conda, else python3 on PATH."""
    if configured:
        return os.path.expanduser(configured)
    for candidate in ("/opt/conda/bin/python",):
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("python3") or shutil.which("python") or sys.executable


# -- subcommands ------------------------------------------------------------------------------
def install_self(root: str) -> str:
    """Keep REMOTE_ROOT/bin/gpu-train-agent equal to the laptop's copy."""
    path = os.path.join(root, "bin", "gpu-train-agent")
    source = AGENT_SOURCE
    if source is None:
        with open(os.path.abspath(__file__)) as f:
            source = f.read()
    try:
        with open(path) as f:
            if f.read() == source:
                return path
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(source)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
    return path


def busy_runs(root: str, base: str) -> list[str]:
    return [r["id"] for r in map(describe, run_dirs(root)) if r["base"] == base and r["state"] in ("starting", "running")]


def clean_staging(root: str, older_than_s: float = 3600) -> None:
    """Code synced for launches that never happened (refused, or the laptop went away)."""
    staging = os.path.join(root, "staging")
    for name in os.listdir(staging) if os.path.isdir(staging) else []:
        path = os.path.join(staging, name)
        with contextlib.suppress(OSError):
            # ctime, not mtime: rsync -a gives the folder its source's (old) mtime while it syncs.
            if time.time() - os.stat(path).st_ctime > older_than_s:
                shutil.rmtree(path, ignore_errors=True)


def reuse_code(root: str, base: str, manifest: str | None, staging: str) -> bool:
    """Stage the last run's code again (hard links) when the laptop's manifest says nothing changed."""
    last = os.path.join(root, "code", f"{base}.last")
    recorded = read_json(os.path.join(root, "code", f"{base}.manifest")) or {}
    if not manifest or recorded.get("manifest") != manifest or not os.path.isdir(last):
        return False
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(os.path.realpath(last), staging, symlinks=True, copy_function=os.link)
    return True


def cmd_launch(root: str, spec: dict, await_go: bool) -> dict:
    """Move the synced code into place and start the job under screen.

    With ``await_go`` the checks run while the laptop is still syncing: the agent prints
    {"ready": true} and waits for "go" on stdin, so the launch costs one round trip after the sync.
    """
    run_id, base = spec["runId"], spec["base"]
    install_self(root)
    if spec.get("agentSettings"):  # the stack's settings (maxResumes, idle stop, ...) for boot and tick
        write_json(os.path.join(root, "agent.json"), {**settings(root), **spec["agentSettings"]})
    clean_staging(root)
    if not shutil.which("screen"):
        raise AgentError("screen is not installed on this host: sudo apt-get install screen")
    want = spec.get("expectGpus") or 0
    if want:
        have = gpu_count()
        if have < want:
            return {"waiting": f"NVIDIA driver: {have}/{want} GPUs visible to nvidia-smi"}
    python = detect_python(spec.get("python"))
    staging = os.path.join(root, "staging", run_id)
    if await_go:
        busy = busy_runs(root, base)
        if busy:
            raise AgentError(f"a run named {base!r} is already running ({', '.join(busy)}): "
                             f"stop it (fab stop --run {busy[0]}) or pick another --name")
        reused = bool(spec.get("reuseCode")) and reuse_code(root, base, spec.get("codeManifest"), staging)
        print(json.dumps({"ready": True, "reused": reused}), flush=True)
        if sys.stdin.readline().strip() != "go":
            raise AgentError("launch aborted by the laptop (the code sync failed)")
    with locked(root):
        busy = busy_runs(root, base)
        if busy:
            shutil.rmtree(staging, ignore_errors=True)
            raise AgentError(f"a run named {base!r} is already running ({', '.join(busy)}): "
                             f"stop it (fab stop --run {busy[0]}) or pick another --name")
        run_dir = os.path.join(root, "runs", run_id)
        if os.path.exists(run_dir):
            raise AgentError(f"run {run_id} already exists on this host: pick another --name")
        try:
            os.makedirs(os.path.dirname(run_dir), exist_ok=True)
            os.mkdir(run_dir)
        except FileExistsError:
            raise AgentError(f"run {run_id} already exists on this host: pick another --name") from None
        if not os.path.isdir(staging):
            os.rmdir(run_dir)
            raise AgentError(f"the code for {run_id} did not arrive (no {staging}): run fab train again")
        os.replace(staging, os.path.join(run_dir, "code"))
        os.makedirs(os.path.join(run_dir, "job"), exist_ok=True)
        last = os.path.join(root, "code", f"{base}.last")
        os.makedirs(os.path.dirname(last), exist_ok=True)
        tmp_link = f"{last}.tmp.{os.getpid()}"
        os.symlink(os.path.join("..", "runs", run_id, "code"), tmp_link)
        os.replace(tmp_link, last)
        if spec.get("codeManifest"):
            write_json(f"{last[:-len('.last')]}.manifest", {"manifest": spec["codeManifest"]})
        write_json(os.path.join(run_dir, "spec.json"), {**spec, "python": python})
        update_state(run_dir, id=run_id, base=base, state="starting", created=now(), resumes=0)
    start_wrapper(root, run_id)
    return {"runId": run_id, "runDir": run_dir, "jobDir": os.path.join(run_dir, "job"),
            "log": os.path.join(run_dir, "log"), "python": python, "screen": run_id}


def start_wrapper(root: str, run_id: str) -> None:
    """The job's wrapper in a detached screen session named after the run (`screen -r RUN` to look)."""
    agent = os.path.join(root, "bin", "gpu-train-agent")
    subprocess.run(["screen", "-dmS", run_id, sys.executable, agent, "--root", root, "wrap", run_id], check=True)


def requirements_step(root: str, run_dir: str, python: str, log) -> None:
    """pip install requirements.txt when it changed since the last install into this Python."""
    req = os.path.join(run_dir, "code", "requirements.txt")
    if not os.path.isfile(req):
        return
    with open(req, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    stamp_dir = os.path.join(root, "python")
    os.makedirs(stamp_dir, exist_ok=True)
    stamp = os.path.join(stamp_dir, hashlib.sha256(python.encode()).hexdigest()[:16] + ".requirements")
    try:
        with open(stamp) as f:
            if f.read().strip() == digest:
                log.write(b"[gpu-train] requirements.txt unchanged since the last install: skipping pip\n")
                return
    except OSError:
        pass
    log.write(f"[gpu-train] installing requirements.txt with {python} -m pip\n".encode())
    log.flush()
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-r", req]
    rc = subprocess.run(pip, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise AgentError(f"pip install -r requirements.txt failed with exit code {rc} (see the log above)")
    with open(stamp, "w") as f:
        f.write(digest)


def job_argv(spec: dict, python: str, job_dir: str, nproc: int) -> list[str]:
    """The job's command line: the script (through torchrun when asked), or the shell command."""
    if not spec.get("script"):
        return ["bash", "-c", spec["command"]]
    tail = [spec["script"], *spec.get("args", []), "--job-dir", job_dir]
    node = spec.get("node") or {}
    if spec.get("launcher") != "torchrun":
        return [python, "-u", *tail]
    run = [python, "-m", "torch.distributed.run"]
    if int(node.get("nnodes", 1)) == 1:
        return [*run, "--standalone", "--nproc_per_node", str(nproc), *tail]
    return [*run, "--nnodes", str(node["nnodes"]), "--node_rank", str(node["rank"]), "--nproc_per_node", str(nproc),
            "--master_addr", node["masterAddr"], "--master_port", str(node["masterPort"]), *tail]


def cluster_env(node: dict, nproc: int) -> dict:
    """What a --command job needs to join its cluster: torch's variables and TensorFlow's TF_CONFIG.

    TF_CONFIG follows AI Platform's clusters: node 0 is the chief, then workers, and with ``ps``
    the last nodes are parameter servers.
    """
    nnodes, rank = int(node.get("nnodes", 1)), int(node.get("rank", 0))
    hosts = node.get("hosts") or [node.get("masterAddr", "localhost")]
    tf_port, ps = int(node.get("tfPort", 2222)), int(node.get("ps", 0))
    addresses = [f"{h}:{tf_port}" for h in hosts]
    roles = ["chief"] + ["worker"] * (nnodes - 1 - ps) + ["ps"] * ps
    cluster = {"chief": addresses[:1]}
    if nnodes - 1 - ps:
        cluster["worker"] = addresses[1 : nnodes - ps]
    if ps:
        cluster["ps"] = addresses[nnodes - ps :]
    index = rank if roles[rank] == "chief" else rank - 1 if roles[rank] == "worker" else rank - (nnodes - ps)
    return {
        "MASTER_ADDR": str(node.get("masterAddr", "localhost")),
        "MASTER_PORT": str(node.get("masterPort", 29500)),
        "NODE_RANK": str(rank),
        "NNODES": str(nnodes),
        "NPROC_PER_NODE": str(nproc),
        "WORLD_SIZE": str(nnodes * nproc),
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": roles[rank], "index": index}}),
    }


def cmd_wrap(root: str, run_id: str) -> int:
    """Run the job (under screen): record pid, times, exit code; log to runs/RUN/log."""
    run_dir = os.path.join(root, "runs", run_id)
    spec = read_json(os.path.join(run_dir, "spec.json")) or {}
    python, job_dir = spec["python"], os.path.join(run_dir, "job")
    update_state(run_dir, wrapperPid=os.getpid(), wrapperStart=proc_start_time(os.getpid()))
    nproc = int(spec.get("nproc") or gpu_count() or 1)
    env = {**os.environ, **spec.get("env", {}), "JOB_DIR": job_dir, "RUN_ID": run_id,
           "PYTHONUNBUFFERED": "1", "GPU_TRAIN_ROOT": root}
    if spec.get("node") and not spec.get("script"):
        env.update(cluster_env(spec["node"], nproc))
    with open(os.path.join(run_dir, "log"), "ab", buffering=0) as log:
        try:
            requirements_step(root, run_dir, python, log)
        except AgentError as e:
            log.write(f"[gpu-train] {e}\n".encode())
            update_state(run_dir, state="failed", exitCode=1, ended=now(), reason=str(e))
            return 1
        argv = job_argv(spec, python, job_dir, nproc)
        resumes = (read_json(os.path.join(run_dir, "state.json")) or {}).get("resumes", 0)
        if resumes:
            log.write(f"[gpu-train] {run_id}: resumed ({resumes}), same RUN_ID and JOB_DIR\n".encode())
        log.write(f"[gpu-train] {run_id}: {shlex.join(argv)}\n".encode())
        proc = subprocess.Popen(argv, cwd=os.path.join(run_dir, "code"), env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        update_state(run_dir, state="running", pid=proc.pid, pidStart=proc_start_time(proc.pid),
                     started=now(), ended=None, exitCode=None)
        code = proc.wait()
        final = final_state(run_dir, code)
        log.write(f"[gpu-train] {run_id}: {final}, exit code {code}\n".encode())
        if final == "interrupted":  # the machine is going down: `boot` resumes it
            update_state(run_dir, state=final, exitCode=code, interruptedAt=now())
        else:
            update_state(run_dir, state=final, exitCode=code, ended=now())
        return code


def final_state(run_dir: str, code: int) -> str:
    if os.path.exists(os.path.join(run_dir, "stop-requested")):
        return "stopped"
    if os.path.exists(os.path.join(run_dir, "shutdown-requested")):
        return "interrupted"
    return "succeeded" if code == 0 else "failed"


def cmd_status(root: str, run_id: str | None, summaries: bool = False) -> dict:
    dirs = [find_run(root, run_id)] if run_id else run_dirs(root)
    runs = sorted((describe(d) for d in dirs), key=lambda r: r.get("created") or 0)
    if summaries:
        for r in runs:
            r["jobSummary"] = tree_summary(r["jobDir"])
    return {"root": root, "runs": runs, "gpus": gpus(), "uptimeS": uptime_s(), "host": os.uname().nodename,
            "agent": agent_view(root), "now": now()}


def cmd_logs(root: str, run_id: str | None, offset: int, lines: int | None, follow: bool) -> int:
    """Write the log from a byte offset (or its last N lines); with follow, until the job ends.

    The last line on stderr is a JSON trailer with the run's state and exit code.
    """
    run_dir = find_run(root, run_id)
    path = os.path.join(run_dir, "log")
    out = sys.stdout.buffer
    pos = offset
    if lines is not None and offset == 0:
        pos = tail_offset(path, lines)
    sys.stderr.write("GPU-TRAIN-START " + json.dumps({"offset": pos}) + "\n")
    sys.stderr.flush()
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(pos)
                chunk = f.read()
        except OSError:
            chunk = b""
        if chunk:
            out.write(chunk)
            out.flush()
            pos += len(chunk)
        info = describe(run_dir)
        if not follow or (info["state"] not in ("starting", "running") and not chunk):
            break
        time.sleep(0.3)
    sys.stderr.write("\nGPU-TRAIN-END " + json.dumps({"runId": info["id"], "state": info["state"],
                                                     "exitCode": info["exitCode"], "offset": pos}) + "\n")
    return 0


def tail_offset(path: str, lines: int) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            block = min(size, 64 * 1024 + lines * 512)
            f.seek(size - block)
            data = f.read()
    except OSError:
        return 0
    cut = len(data)
    for _ in range(lines + (1 if data.endswith(b"\n") else 0)):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return size - block
    return size - block + cut + 1


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def cmd_stop(root: str, run_id: str | None, grace: float) -> dict:
    """SIGINT, a grace period, SIGTERM, another, then SIGKILL, to the job's process group."""
    run_dir = find_run(root, run_id)
    state = read_json(os.path.join(run_dir, "state.json")) or {}
    info = describe(run_dir)
    if info["state"] not in ("starting", "running"):
        return {"runId": info["id"], "state": info["state"], "signals": []}
    open(os.path.join(run_dir, "stop-requested"), "w").close()
    pid = state.get("pid")
    sent = []
    if pid and alive(pid, state.get("pidStart")):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if not signal_group(pid, sig):
                break
            sent.append(sig.name)
            deadline = time.time() + (grace if sig != signal.SIGKILL else 5)
            while time.time() < deadline and alive(pid, state.get("pidStart")):
                time.sleep(0.1)
            if not alive(pid, state.get("pidStart")):
                break
    wrapper = state.get("wrapperPid")
    deadline = time.time() + 5
    while time.time() < deadline and alive(wrapper, state.get("wrapperStart")):
        time.sleep(0.1)
    if effective_state(read_json(os.path.join(run_dir, "state.json")) or {}) not in TERMINAL:
        update_state(run_dir, state="stopped", ended=now())  # the wrapper was gone: record it ourselves
    return {"runId": info["id"], "state": describe(run_dir)["state"], "signals": sent}


# -- the agent's own settings, boot, shutdown and idle stop -----------------------------------
DEFAULT_SETTINGS = {
    "idleStopMinutes": 0,  # 0: never power off (SSH stacks unless asked; GCP stacks default to 30)
    "maxResumes": 10,
    "sshPort": 22,
    "poweroffCommand": ["systemctl", "poweroff"],
    "gcp": False,
    "maxRunHours": None,
}
METADATA = "http://169.254.169.254/computeMetadata/v1/instance/"


def settings(root: str) -> dict:
    return {**DEFAULT_SETTINGS, **(read_json(os.path.join(root, "agent.json")) or {})}


def agent_log(root: str, text: str) -> None:
    with open(os.path.join(root, "agent.log"), "a") as f:
        f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")


def cmd_boot(root: str) -> dict:
    """After a reboot, preemption or maintenance: relaunch every run that was running, same RUN_ID
    and JOB_DIR, so a job that resumes from its newest checkpoint carries on. maxResumes stops a
    crash loop."""
    limit = int(settings(root)["maxResumes"])
    actions = []
    with locked(root):
        for run_dir in run_dirs(root):
            state = read_json(os.path.join(run_dir, "state.json")) or {}
            run_id = os.path.basename(run_dir)
            if effective_state(state) != "interrupted":
                continue
            resumes = int(state.get("resumes", 0))
            if resumes >= limit:
                reason = f"interrupted {resumes + 1} times; not resumed again (maxResumes = {limit})"
                update_state(run_dir, state="failed", ended=now(), reason=reason)
                agent_log(root, f"{run_id}: {reason}")
                actions.append({"runId": run_id, "action": "failed", "reason": reason})
                continue
            relaunch(root, run_dir, state)
            actions.append({"runId": run_id, "action": "resumed", "resumes": resumes + 1})
    return {"actions": actions}


def relaunch(root: str, run_dir: str, state: dict) -> None:
    """Start a run again under screen, same RUN_ID and JOB_DIR, counting the resume."""
    for marker in ("shutdown-requested", "stop-requested"):
        with contextlib.suppress(OSError):
            os.remove(os.path.join(run_dir, marker))
    resumes = int(state.get("resumes", 0)) + 1
    update_state(run_dir, state="starting", created=state.get("created", now()), resumes=resumes,
                 wrapperPid=None, wrapperStart=None, pid=None, pidStart=None, relaunched=now(), ended=None,
                 exitCode=None, reason=None,
                 preemptions=int(state.get("preemptions", 0)) + int(bool(state.get("preempted"))), preempted=False)
    start_wrapper(root, os.path.basename(run_dir))
    agent_log(root, f"{os.path.basename(run_dir)}: resumed ({resumes})")


def cmd_resume(root: str, run_id: str | None, grace: float) -> dict:
    """Restart one run's part on this host (the laptop does it on every node: the whole group)."""
    run_dir = find_run(root, run_id)
    if describe(run_dir)["state"] in ("starting", "running"):
        cmd_stop(root, os.path.basename(run_dir), grace)
    state = read_json(os.path.join(run_dir, "state.json")) or {}
    with locked(root):
        relaunch(root, run_dir, state)
    return {"runId": os.path.basename(run_dir), "resumes": int(state.get("resumes", 0)) + 1}


def preempted() -> bool:
    """Compute Engine's word on whether this stop is a preemption (False off GCP)."""
    import urllib.request

    req = urllib.request.Request(METADATA + "preempted", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(req, timeout=1) as r:
            return r.read().decode().strip().upper() == "TRUE"
    except OSError:
        return False


def cmd_shutdown(root: str, grace: float) -> dict:
    """The machine is going down: SIGTERM each job so it saves a last checkpoint, wait up to
    ``grace`` seconds, record the runs as interrupted (preempted when Compute Engine says so)."""
    was_preempted = settings(root)["gcp"] and preempted()
    running = []
    for run_dir in run_dirs(root):
        state = read_json(os.path.join(run_dir, "state.json")) or {}
        if effective_state(state) not in ("starting", "running"):
            continue
        open(os.path.join(run_dir, "shutdown-requested"), "w").close()
        if state.get("pid") and alive(state["pid"], state.get("pidStart")):
            signal_group(state["pid"], signal.SIGTERM)
        running.append((run_dir, state))
    deadline = time.time() + grace
    while time.time() < deadline and any(alive(st.get("pid"), st.get("pidStart")) for _, st in running):
        time.sleep(0.2)
    # Give the wrappers a moment to record the exit codes, then make sure every run says interrupted.
    settle = time.time() + 2
    while time.time() < settle and any(alive(st.get("wrapperPid"), st.get("wrapperStart")) for _, st in running):
        time.sleep(0.1)
    result = []
    for run_dir, _ in running:
        current = read_json(os.path.join(run_dir, "state.json")) or {}
        if current.get("state") not in TERMINAL:
            update_state(run_dir, state="interrupted", interruptedAt=current.get("interruptedAt") or now(),
                         preempted=bool(was_preempted))
        result.append({"runId": os.path.basename(run_dir), "state": describe(run_dir)["state"]})
        agent_log(root, f"{os.path.basename(run_dir)}: interrupted by shutdown (preempted: {bool(was_preempted)})")
    return {"runs": result, "preempted": bool(was_preempted)}


def ssh_sessions(port: int) -> int:
    """Established TCP connections to the SSH port (open sessions, `fab logs --follow` included)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            parts = row.split()
            if len(parts) > 3 and parts[3] == "01" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def idle_decision(now_s: float, idle_since: float | None, minutes: float, jobs_running: int, sessions: int,
                  gpu_util: float) -> tuple[float | None, bool, str]:
    """(idle since, power off now?, why). Idle means: no job, no SSH session, GPUs under 5% busy."""
    if minutes <= 0:
        return None, False, "idle stop is off"
    busy = []
    if jobs_running:
        busy.append(f"{jobs_running} job(s) running")
    if sessions:
        busy.append(f"{sessions} SSH session(s) open")
    if gpu_util >= 5:
        busy.append(f"GPU {gpu_util:.0f}% busy")
    if busy:
        return None, False, "busy: " + ", ".join(busy)
    since = now_s if idle_since is None else idle_since
    idle_min = (now_s - since) / 60
    if idle_min >= minutes:
        return since, True, f"idle {idle_min:.0f} min, limit {minutes:g}: powering off"
    return since, False, f"idle {idle_min:.0f} min, stops at {minutes:g}"


def cmd_tick(root: str) -> dict:
    """Every minute: power the machine off when it has been idle for idleStopMinutes."""
    conf = settings(root)
    path = os.path.join(root, "idle.json")
    jobs = sum(1 for d in run_dirs(root) if describe(d)["state"] in ("starting", "running"))
    util = max((g["utilization"] for g in gpus()), default=0.0)
    since, stop, why = idle_decision(time.time(), (read_json(path) or {}).get("idleSince"),
                                     float(conf["idleStopMinutes"]), jobs, ssh_sessions(int(conf["sshPort"])), util)
    write_json(path, {"idleSince": since, "why": why, "checked": now()})
    if stop:
        agent_log(root, why)
        subprocess.run(conf["poweroffCommand"], check=False)
    return {"idleSince": since, "poweroff": stop, "why": why}


def cmd_configure(root: str, new: dict, cron: bool) -> dict:
    """Write agent.json; with ``cron``, run `boot` at reboot (and `tick` every minute when idle stop is on)."""
    agent = install_self(root)
    write_json(os.path.join(root, "agent.json"), {**settings(root), **new})
    if not cron:
        return {"settings": settings(root)}
    if not shutil.which("crontab"):
        raise AgentError("crontab is not installed on this host (sudo apt-get install cron); "
                         "or run `gpu-train-agent boot` from your own boot hook")
    current = subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout
    py = shlex.quote(sys.executable)
    base = f"{py} {shlex.quote(agent)} --root {shlex.quote(root)}"
    tag = f"# gpu-train {root}"
    keep = [line for line in current.splitlines() if not line.endswith(tag)]
    lines = [*keep, f"@reboot {base} boot >/dev/null 2>&1 {tag}"]
    if float(settings(root)["idleStopMinutes"]) > 0:
        lines.append(f"* * * * * {base} tick >/dev/null 2>&1 {tag}")
    subprocess.run(["crontab", "-"], input="\n".join(lines) + "\n", text=True, check=True)
    return {"settings": settings(root), "crontab": [line for line in lines if line.endswith(tag)]}


def agent_view(root: str) -> dict:
    """What `fab status` shows of the agent: its settings and the idle clock."""
    conf = settings(root)
    idle = read_json(os.path.join(root, "idle.json")) or {}
    return {"idleStopMinutes": conf["idleStopMinutes"], "maxResumes": conf["maxResumes"],
            "maxRunHours": conf["maxRunHours"], "idleSince": idle.get("idleSince"), "idleWhy": idle.get("why"),
            "installed": os.path.exists(os.path.join(root, "agent.json"))}


# -- entry point ------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu-train-agent")
    p.add_argument("--root", required=True)
    sub = p.add_subparsers(dest="cmd", required=True)
    launch = sub.add_parser("launch")
    launch.add_argument("spec", help="base64 JSON")
    launch.add_argument("--await-go", action="store_true")
    wrap = sub.add_parser("wrap")
    wrap.add_argument("run")
    status = sub.add_parser("status")
    status.add_argument("--run")
    status.add_argument("--summaries", action="store_true", help="with each run's JOB_DIR summary (for fetch)")
    logs = sub.add_parser("logs")
    logs.add_argument("--run")
    logs.add_argument("--offset", type=int, default=0)
    logs.add_argument("--lines", type=int)
    logs.add_argument("--follow", action="store_true")
    stop = sub.add_parser("stop")
    stop.add_argument("--run")
    stop.add_argument("--grace", type=float, default=10.0)
    sub.add_parser("boot")
    resume = sub.add_parser("resume")
    resume.add_argument("--run")
    resume.add_argument("--grace", type=float, default=10.0)
    shutdown = sub.add_parser("shutdown")
    shutdown.add_argument("--grace", type=float, default=25.0)
    sub.add_parser("tick")
    configure = sub.add_parser("configure")
    configure.add_argument("settings", help="base64 JSON written to REMOTE_ROOT/agent.json")
    configure.add_argument("--cron", action="store_true", help="install boot (and tick) in the user's crontab")
    args = p.parse_args(argv)
    root = os.path.abspath(os.path.expanduser(args.root))
    os.makedirs(root, exist_ok=True)
    try:
        if args.cmd == "wrap":
            return cmd_wrap(root, args.run)
        if args.cmd == "logs":
            return cmd_logs(root, args.run, args.offset, args.lines, args.follow)
        if args.cmd == "launch":
            result = cmd_launch(root, json.loads(base64.b64decode(args.spec)), args.await_go)
        elif args.cmd == "status":
            result = cmd_status(root, args.run, args.summaries)
        elif args.cmd == "stop":
            result = cmd_stop(root, args.run, args.grace)
        elif args.cmd == "boot":
            result = cmd_boot(root)
        elif args.cmd == "resume":
            result = cmd_resume(root, args.run, args.grace)
        elif args.cmd == "shutdown":
            result = cmd_shutdown(root, args.grace)
        elif args.cmd == "tick":
            result = cmd_tick(root)
        else:
            result = cmd_configure(root, json.loads(base64.b64decode(args.settings)), args.cron)
    except AgentError as e:  # `logs` streams the log on stdout, so its errors go to stderr
        print(json.dumps({"error": str(e)}), file=sys.stderr if args.cmd == "logs" else sys.stdout)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
