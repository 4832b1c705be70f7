"""`wrap`: the process under screen that runs one job, installs its requirements and records its end."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess

from .procs import gpu_count, proc_start_time
from .protocol import FAILED, INTERRUPTED, RUNNING, STOPPED, SUCCEEDED, project_dirs
from .store import AgentError, now, read_json, read_state, update_state

PIP_TAIL_LINES = 15


def tail_lines(path: str, n: int = PIP_TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            return f.read().decode("utf-8", "replace").splitlines()[-n:]
    except OSError:
        return []


@contextlib.contextmanager
def env_lock(env_dir: str):
    """One venv creation or pip install at a time per project (two runs may start together)."""
    os.makedirs(os.path.dirname(env_dir), exist_ok=True)
    with open(f"{env_dir}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def job_python(root: str, run_dir: str, spec: dict, log) -> str:
    """The Python the job runs with: the stack's (or detected) one, or the project's venv made from it.

    The venv keeps the system site packages, so a torch installed on the host is used as it is,
    and requirements.txt installs only what is missing, into the project's own folder.
    """
    base = spec["python"]
    if not spec.get("venv"):
        return base
    env_dir, _ = project_dirs(root, spec.get("project"))
    python = os.path.join(env_dir, "bin", "python")
    with env_lock(env_dir):
        if not os.access(python, os.X_OK):
            log.write(f"[gpu-train] creating the project's virtual environment {env_dir} from {base} "
                      "(with the system site packages)\n".encode())
            made = subprocess.run([base, "-m", "venv", "--system-site-packages", env_dir], capture_output=True, text=True)
            if made.returncode != 0:
                shutil.rmtree(env_dir, ignore_errors=True)
                why = (made.stderr or made.stdout).strip().splitlines()[-1:] or [f"exit {made.returncode}"]
                raise AgentError(f"{base} -m venv failed ({why[0]}): on Debian/Ubuntu install python3-venv "
                                 f"(sudo apt install python3-venv), or set gpu-train:venv: false to run with {base} itself")
    return python


def requirements_step(root: str, run_dir: str, python: str, log) -> None:
    """pip install requirements.txt when it changed since the last install into this Python.

    pip's output goes to pip.log beside the run's log; the log says where, and gets pip's last
    lines only when it fails.
    """
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
    pip_log = os.path.join(run_dir, "pip.log")
    log.write(f"[gpu-train] installing requirements.txt with {python} -m pip (its output: {pip_log})\n".encode())
    log.flush()
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-r", req]
    with open(pip_log, "ab") as out:
        rc = subprocess.run(pip, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=os.path.join(run_dir, "code")).returncode
    if rc != 0:
        lines = tail_lines(pip_log)
        log.write("".join(f"[gpu-train] pip: {ln}\n" for ln in lines).encode())
        last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
        raise AgentError(f"pip install -r requirements.txt failed (exit {rc}): {last[:300]} (all of it: {pip_log})")
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
    job_dir = os.path.join(run_dir, "job")
    update_state(run_dir, wrapperPid=os.getpid(), wrapperStart=proc_start_time(os.getpid()))
    nproc = int(spec.get("nproc") or gpu_count() or 1)
    env_dir, data_dir = project_dirs(root, spec.get("project"))
    env = {**os.environ, **spec.get("env", {}), "JOB_DIR": job_dir, "RUN_ID": run_id, "DATA_DIR": data_dir,
           "PYTHONUNBUFFERED": "1", "GPU_TRAIN_ROOT": root}
    if spec.get("venv"):
        env.update(VIRTUAL_ENV=env_dir, PATH=f"{env_dir}/bin:{env.get('PATH', '')}")
    if spec.get("node") and not spec.get("script"):
        env.update(cluster_env(spec["node"], nproc))
    with open(os.path.join(run_dir, "log"), "ab", buffering=0) as log:
        try:
            python = job_python(root, run_dir, spec, log)
            if spec.get("venv"):
                with env_lock(env_dir):
                    requirements_step(root, run_dir, python, log)
            else:
                requirements_step(root, run_dir, python, log)
            link_data(data_dir, os.path.join(run_dir, "code"), log)
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


def link_data(data_dir: str, code_dir: str, log) -> None:
    """What `gpu-train push` sent, also where the code looks for it: data/ in the working directory
    (a symlink per top-level entry of DATA_DIR the code does not have itself)."""
    if not os.path.isdir(data_dir):
        return
    linked = []
    for name in sorted(os.listdir(data_dir)):
        dest = os.path.join(code_dir, name)
        if not os.path.lexists(dest):
            os.symlink(os.path.join(data_dir, name), dest)
            linked.append(name)
    if linked:
        log.write(f"[gpu-train] DATA_DIR={data_dir}; linked into the working directory: {', '.join(linked)}\n".encode())


def final_state(run_dir: str, code: int) -> str:
    if os.path.exists(os.path.join(run_dir, "stop-requested")):
        return STOPPED
    if os.path.exists(os.path.join(run_dir, "shutdown-requested")):
        return INTERRUPTED
    return SUCCEEDED if code == 0 else FAILED


