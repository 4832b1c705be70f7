"""`wrap`: the process under screen that runs one job, installs its requirements and records its end."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess

from .procs import gpu_count, proc_start_time
from .protocol import FAILED, INTERRUPTED, RUNNING, STOPPED, SUCCEEDED
from .store import AgentError, now, read_json, read_state, update_state


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
            update_state(run_dir, state=FAILED, exitCode=1, ended=now(), reason=str(e))
            return 1
        argv = job_argv(spec, python, job_dir, nproc)
        resumes = read_state(run_dir).get("resumes", 0)
        if resumes:
            log.write(f"[gpu-train] {run_id}: resumed ({resumes}), same RUN_ID and JOB_DIR\n".encode())
        log.write(f"[gpu-train] {run_id}: {shlex.join(argv)}\n".encode())
        proc = subprocess.Popen(argv, cwd=os.path.join(run_dir, "code"), env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        update_state(run_dir, state=RUNNING, pid=proc.pid, pidStart=proc_start_time(proc.pid),
                     started=now(), ended=None, exitCode=None)
        code = proc.wait()
        final = final_state(run_dir, code)
        log.write(f"[gpu-train] {run_id}: {final}, exit code {code}\n".encode())
        if final == INTERRUPTED:  # the machine is going down: `boot` resumes it
            update_state(run_dir, state=final, exitCode=code, interruptedAt=now())
        else:
            update_state(run_dir, state=final, exitCode=code, ended=now())
        return code


def final_state(run_dir: str, code: int) -> str:
    if os.path.exists(os.path.join(run_dir, "stop-requested")):
        return STOPPED
    if os.path.exists(os.path.join(run_dir, "shutdown-requested")):
        return INTERRUPTED
    return SUCCEEDED if code == 0 else FAILED


