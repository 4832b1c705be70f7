"""`wrap`: the process under screen that runs one job, installs its requirements and records its end."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import shlex
import signal
import socket
import subprocess
from collections.abc import Iterator
from types import FrameType
from typing import IO, Any

from gpu_train.contract import (
    FAILED,
    INTERRUPTED,
    NOTICE,
    NOTICE_ENV,
    RESUMES_ENV,
    ROOT_ENV,
    RUNNING,
    SHUTDOWN_REQUESTED,
    STOP_REQUESTED,
    STOPPED,
    SUCCEEDED,
    JobSpec,
    resume_if_path,
)
from gpu_train.ownership import project_dirs

from . import containerrun, datalink, notify, pyenv, source, sweep, upload, uvfetch
from .clusterenv import cluster_env
from .procs import gpu_count, proc_start_time
from .status import run_seconds
from .store import AgentError, last_line, now, read_spec, read_state, run_locked, spec_or_none, update_state
from .units import system_stopping

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
def env_lock(path: str) -> Iterator[None]:
    """One venv creation or install at a time per environment (two runs may start together)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(f"{path}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def environment_step(w: Wrapper, root: str, run_dir: str, base: str, venv: str | None) -> str:
    """The job's Python, ready: the project's venv made (or rebuilt when it is gone or its base
    changed) and the code's dependencies installed when they changed since the last install there.

    uv does both where it can be had (uvfetch.py), with its cache on REMOTE_ROOT; else venv and pip,
    and the log says why. Their output goes to pip.log beside the run's log; the log says where, and
    gets its last lines only when it fails.
    """
    code_dir = os.path.join(run_dir, "code")
    files = pyenv.dependency_files(code_dir)
    tool_env = {**os.environ, **pyenv.cache_dirs(root), "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}
    python = pyenv.venv_python(venv) if venv else base
    stamp = os.path.join(root, "python", hashlib.sha256(python.encode()).hexdigest()[:16] + ".requirements")
    with env_lock(venv or stamp):
        problem = pyenv.venv_problem(venv, base) if venv else None
        source, _ = pyenv.install_plan(files, have_uv=True)
        digest = pyenv.install_digest(source, files, python) if source and not problem else None
        last = (read_text(stamp) or "").split()  # the last install here: its digest, and that of its files
        if digest and last[:1] == [digest]:
            w.say(f"{source} unchanged since the last install: skipping the install")
            return python
        if not problem and not source:
            return python
        uv, found = uvfetch.find_uv(root, tool_env)
        if uv:
            tool_env.update(uvfetch.uv_index_env(uvfetch.read_pip_index(tool_env)))
        else:
            w.say(f"uv is not available ({found}): using venv and pip instead (slower)")
        if problem and venv:
            if problem != "it does not exist yet":
                w.say(f"rebuilding the project's virtual environment {venv}: {problem}")
            pyenv.make_venv(venv, base, uv, tool_env, w.say)
        source, why = pyenv.install_plan(files, have_uv=uv is not None)
        if why:
            w.say(why)
        if source:
            # A rebuilt venv with the same requirements: the same packages, from uv's cache alone (asking
            # the index costs a round trip per package and may pick newer versions than the venv had).
            again = bool(uv and problem and last[1:2] == [pyenv.files_digest(source, files)])
            if not (again and install(w, run_dir, python, uv, found, source, tool_env, offline=True)):
                install(w, run_dir, python, uv, found, source, tool_env)
            os.makedirs(os.path.dirname(stamp), exist_ok=True)
            with open(stamp, "w") as f:
                f.write(f"{pyenv.install_digest(source, files, python)} {pyenv.files_digest(source, files)}")
    return python


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def install(
    w: Wrapper, run_dir: str, python: str, uv: str | None, found: str, source: str, env: dict[str, str], offline: bool = False
) -> bool:
    """Install ``source``; with ``offline``, from uv's cache alone, answering False where that is not
    enough (the caller then installs as usual)."""
    code_dir = os.path.join(run_dir, "code")
    pip_log = os.path.join(run_dir, "pip.log")
    how = f"{found} (cache {env['UV_CACHE_DIR']}{', offline' if offline else ''})" if uv else f"{python} -m pip"
    w.say(f"installing {source} with {how} into {python} (its output: {pip_log})")
    w.log.flush()
    tool = "uv" if uv else "pip"
    for argv in pyenv.install_argv(source, python, uv, code_dir, run_dir, offline):
        with open(pip_log, "ab") as out:  # started under the run's lock, in its own group: `fab stop` ends it
            rc = w.start(argv, "step_pid", stdout=out, cwd=code_dir, env=env).wait()
            w.child = None
        if rc != 0 and offline:
            w.say("not all of it is in uv's cache: from the index then")
            return False
        if rc != 0:
            lines = tail_lines(pip_log)
            w.log.write("".join(f"[gpu-train] {tool}: {ln}\n" for ln in lines).encode())
            why = pyenv.failure_reason(lines)
            raise AgentError(f"{tool} install -r {source} failed (exit {rc}): {why[:300]} (all of it: {pip_log})")
    return True


def job_argv(spec: JobSpec, python: str, job_dir: str, nproc: int, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The job's command line: the script (through torchrun when asked), or the shell command; with
    ``--job-dir JOB_DIR`` only when the spec asks for it, and ``extra`` (the resume arguments) last."""
    if not spec.script:
        command = spec.command or ""
        return ["bash", "-c", " ".join([command, shlex.join(extra)]) if extra else command]
    tail = [spec.script, *spec.args, *(["--job-dir", job_dir] if spec.pass_job_dir else []), *extra]
    node: dict[str, Any] = spec.node or {}
    if spec.launcher != "torchrun":
        return [python, "-u", *tail]
    run = [python, "-m", "torch.distributed.run"]
    if int(node.get("nnodes", 1)) == 1:
        return [*run, "--standalone", "--nproc_per_node", str(nproc), *tail]
    return [
        *run,
        "--nnodes",
        str(node["nnodes"]),
        "--node_rank",
        str(node["rank"]),
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        node["masterAddr"],
        "--master_port",
        str(node["masterPort"]),
        *tail,
    ]


def resume_args(spec: JobSpec, resumes: int, workdir: str, job_dir: str) -> tuple[list[str], str | None]:
    """(the arguments a relaunch adds, what the log says about them): ``resumeArgs`` from the first
    relaunch on, but only once ``resumeIf`` (a file or glob in the working directory, or ``$JOB_DIR/...``)
    matches, so a relaunch before the first checkpoint starts fresh, with the original arguments."""
    extra = list(spec.resume_args)
    if not resumes or not extra:
        return [], None
    wanted = spec.resume_if
    if not wanted:
        return extra, f"resume arguments added: {shlex.join(extra)}"
    if glob.glob(resume_if_path(wanted, workdir, job_dir), recursive=True):
        return extra, f"{wanted} exists: resume arguments added: {shlex.join(extra)}"
    return [], f"{wanted} not there yet: starting fresh, without the resume arguments"


class Halted(Exception):
    """A stop or a shutdown came before the job started: the run ends in ``state``, the job never runs."""

    def __init__(self, state: str):
        super().__init__(state)
        self.state = state


class Wrapper:
    """Runs one run's steps (pip, then the job), each in a process group of its own, and records them.

    A step starts under the run's lock after a look for a stop request, so `fab stop` either finds
    the step's pid to signal or leaves a request the wrapper sees before starting it. SIGTERM to the
    wrapper (its unit stopped, the machine going down) is passed on to the running step; SIGHUP (the
    screen session ending) is ignored, so the wrapper outlives screen to record the end.
    """

    def __init__(self, root: str, run_id: str, log: IO[bytes]):
        self.root, self.run_id, self.log = root, run_id, log
        self.run_dir = os.path.join(root, "runs", run_id)
        self.child: subprocess.Popen[bytes] | None = None
        self.terminated = False

    def say(self, text: str) -> None:
        """A line of ours in the run's log, on a line of its own: a job's progress bar (tqdm) leaves the
        log mid-line, and a note glued to it was that bar's text in `logs` and status's LAST LINE."""
        self.log.write(f"{'' if self.at_line_start() else chr(10)}[gpu-train] {text}\n".encode())

    def at_line_start(self) -> bool:
        try:
            with open(os.path.join(self.run_dir, "log"), "rb") as f:
                f.seek(-1, os.SEEK_END)
                return f.read(1) == b"\n"
        except OSError:  # empty (nothing to end), or gone
            return True

    def on_term(self, signum: int, _frame: FrameType | None) -> None:
        self.terminated = True
        if self.child is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.child.pid, signum)

    def halted(self) -> str | None:
        """The state a request asks for: stopped, interrupted (a shutdown), or None to go on."""
        if os.path.exists(os.path.join(self.run_dir, STOP_REQUESTED)):
            return STOPPED
        if os.path.exists(os.path.join(self.run_dir, SHUTDOWN_REQUESTED)) or (self.terminated and system_stopping()):
            return INTERRUPTED
        return STOPPED if self.terminated else None

    def start(self, argv: list[str], pid_field: str, **popen: Any) -> subprocess.Popen[bytes]:
        """Start a step unless a stop came first; its pid is recorded under the run's lock
        (``pid``/``pid_start`` for the job, ``step_pid``/``step_start`` for pip)."""
        start_field = {"pid": "pid_start", "step_pid": "step_start"}[pid_field]
        with run_locked(self.run_dir):
            state = self.halted()
            if state:
                raise Halted(state)
            popen.setdefault("stdout", self.log)
            self.child = subprocess.Popen(argv, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, **popen)
            update_state(self.run_dir, **{pid_field: self.child.pid, start_field: proc_start_time(self.child.pid)})
        return self.child


def check_python(python: str) -> None:
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise AgentError(f"the job's Python {python} does not exist or is not executable (gpu-train:python)")


def check_writable(job_dir: str) -> None:
    try:
        os.makedirs(job_dir, exist_ok=True)
        probe = os.path.join(job_dir, f".gpu-train-write-test.{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise AgentError(f"JOB_DIR {job_dir} is not writable: {e.strerror or e}") from None


def cmd_wrap(root: str, run_id: str) -> int:
    """Run the job: record pid, times, exit code; log to runs/RUN/log. Any error before the job
    starts fails the run with its reason (never `interrupted`, so never relaunched)."""
    run_dir = os.path.join(root, "runs", run_id)
    source.hold()
    update_state(run_dir, wrapper_pid=os.getpid(), wrapper_start=proc_start_time(os.getpid()))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        log = open(os.path.join(run_dir, "log"), "ab", buffering=0)  # noqa: SIM115 (closed below)
    except OSError as e:
        update_state(run_dir, state=FAILED, exit_code=1, ended=now(), reason=f"cannot write the run's log: {e}")
        return 1
    with log:
        w = Wrapper(root, run_id, log)
        signal.signal(signal.SIGTERM, w.on_term)
        try:
            proc = prepare_and_start(w, root, run_dir, run_id)
        except Halted as h:
            w.say(f"{run_id}: {h.state} before the job started")
            return record_end(run_dir, h.state, None)
        except Exception as e:  # the job never started: a failure with its reason, whatever it was
            reason = str(e) if isinstance(e, AgentError) else f"the wrapper failed before the job started: {e!r}"
            state = w.halted() or FAILED  # a stop that killed pip is a stop, not a pip failure
            w.say(reason if state == FAILED else f"{run_id}: {state} before the job started")
            return record_end(run_dir, state, 1, reason if state == FAILED else None)
        uploader = upload.start(root, run_dir)  # gpu-train:bucket: JOB_DIR to the bucket as it is written
        code = containerrun.wait(w, root, run_dir, proc)  # (a container outlives a killed client: attached again)
        final = final_state(run_dir, code, w)
        w.say(f"{run_id}: {final}, exit code {code}")
        upload.finish(uploader, w.say)  # before the end is recorded: `down` waits for a run until it is in the bucket
        return record_end(run_dir, final, code)


def prepare_and_start(w: Wrapper, root: str, run_dir: str, run_id: str) -> subprocess.Popen[bytes]:
    spec = read_spec(run_dir)
    python, job_dir = spec.python or "python3", os.path.join(run_dir, "job")  # (launch always sets it)
    if spec.container:  # the image's own Python; nothing is installed into the image
        python = "python3"
    elif spec.script or pyenv.dependency_files(os.path.join(run_dir, "code")):
        check_python(python)
    check_writable(job_dir)
    nproc = int(spec.nproc or gpu_count() or 1)
    env_dir, data_dir = project_dirs(root, spec.project)
    resumes = read_state(run_dir).resumes
    env = {
        **os.environ,
        **spec.env,
        "JOB_DIR": job_dir,
        "RUN_ID": run_id,
        "DATA_DIR": data_dir,
        RESUMES_ENV: str(resumes),
        "PYTHONUNBUFFERED": "1",
        ROOT_ENV: root,
        NOTICE_ENV: os.path.join(run_dir, NOTICE),
    }
    deps = bool(pyenv.dependency_files(os.path.join(run_dir, "code"))) and not spec.container
    venv = pyenv.run_env(env_dir, python, spec.venv and not spec.container, spec.externally_managed, deps)
    if venv:
        env.update(VIRTUAL_ENV=venv, PATH=f"{venv}/bin:{env.get('PATH', '')}")
    elif spec.venv:
        w.say(f"{python} is a virtual environment's own Python: the job runs with it as it is")
    if spec.node and not spec.script:
        env.update(cluster_env(spec.node, nproc))
    python = python if spec.container else environment_step(w, root, run_dir, python, venv)
    workdir = os.path.join(run_dir, "code")
    upload.bring_data(root, run_dir, w.say)  # `push --to bucket`: to local disk first
    datalink.link_data(data_dir, workdir, w.log, [m["folder"] for m in spec.bucket_data] if spec.bucket_data else None)
    extra, said = resume_args(spec, resumes, workdir, job_dir)
    own = bool(spec.container and spec.container.own_program)
    argv = [] if own else job_argv(spec, python, job_dir, nproc, extra)
    if resumes:
        w.say(f"{run_id}: resumed ({resumes}), same RUN_ID and JOB_DIR; {RESUMES_ENV}={resumes}" + (f"; {said}" if said else ""))
    if spec.container:
        proc = containerrun.start(w, root, run_dir, spec, env, argv, extra)
        update_state(run_dir, state=RUNNING, started=now(), ended=None, exit_code=None)
        return proc
    w.say(f"{run_id}: {shlex.join(argv)}")
    try:
        proc = w.start(argv, "pid", cwd=workdir, env=env)
    except OSError as e:
        raise AgentError(f"cannot start the job ({argv[0]}): {e.strerror or e}") from None
    update_state(run_dir, state=RUNNING, started=now(), ended=None, exit_code=None)
    return proc


def record_end(run_dir: str, final: str, code: int | None, reason: str | None = None) -> int:
    if final == INTERRUPTED:  # the machine is going down: `boot` resumes it
        update_state(run_dir, state=final, exit_code=code, interrupted_at=now())
    else:
        update_state(run_dir, state=final, exit_code=code, ended=now(), **({"reason": reason} if reason else {}))
        announce_end(run_dir)
        sweep.after_trial(os.path.dirname(os.path.dirname(run_dir)), run_dir)  # a sweep's trial: the next into its slot
    return code if code is not None else 0


def announce_end(run_dir: str) -> None:
    """Tell the run's webhook (its stack's, as its launch kept it: notify.kept) how the run ended, from node 0 only; after the
    state is recorded, within the webhook's short timeout, never raising."""
    root = os.path.dirname(os.path.dirname(run_dir))
    url = notify.kept(root, os.path.basename(run_dir))
    spec = spec_or_none(run_dir)
    node: dict[str, Any] = (spec and spec.node) or {}
    if not url or int(node.get("rank") or 0) != 0:
        return
    st = read_state(run_dir)
    took = run_seconds(st, st.state, None, now())  # as `status` says it: summed over the run's starts
    failed = st.state == FAILED
    line = st.reason if failed and st.exit_code is None else last_line(os.path.join(run_dir, "log"), failed)
    notify.send(url, notify.run_end_text(os.path.basename(run_dir), st.state, st.exit_code, took, line or "", socket.gethostname()))


def final_state(run_dir: str, code: int, w: Wrapper | None = None) -> str:
    """How a job's end counts: a requested stop, a shutdown (resumed at the next boot), or its own."""
    if os.path.exists(os.path.join(run_dir, STOP_REQUESTED)):
        return STOPPED
    if os.path.exists(os.path.join(run_dir, SHUTDOWN_REQUESTED)):
        return INTERRUPTED
    if w is not None and w.terminated:  # SIGTERM from outside: the machine stopping, or its unit stopped
        return INTERRUPTED if system_stopping() else STOPPED
    return SUCCEEDED if code == 0 else FAILED
