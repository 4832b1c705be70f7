"""`tensorboard`, `jupyter`, `tunnel`: a server on the host, opened on the laptop's localhost.

The server listens on the host's 127.0.0.1 only; the task's own SSH connection carries it
(``remote.tasks.notebooks``). Ctrl-C stops the forward and the server both; so do SIGTERM and SIGHUP (a
process manager's stop, a closed terminal), which the executor turns into Ctrl-C.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from invoke import Context, task

from gpu_train.environment import Environment
from gpu_train.errors import GpuTrainError, UsageError
from remote.tasks.session import STACK_HELP, Session, say
from remote.tasks.taskoptions import ServeOptions
from remote.tasks.trust import number

LOCAL_HELP = "local port (default: the server's usual port when free, else any free one)"


def show(json_: bool) -> Callable[[str], None]:
    """How the local URL is printed: alone on a line, or as {"url": ...} with --json."""
    return lambda url: print(json.dumps({"url": url}) if json_ else url, flush=True)


def serve(env: Environment, o: ServeOptions) -> None:
    """`tensorboard`'s and `jupyter`'s work for checked options: the server on the host (bound to localhost
    there) through an SSH forward, or TensorBoard here over fetched runs; until Ctrl-C."""
    from remote.tasks import notebooks

    if o.fetched:
        _serve_fetched(env, o)
        return
    session = Session(env, o.stack)
    try:
        conn = session.connect(shared=False)  # (before the target: a root asked of the host is asked over it)
        root = session.target.remote_root
        settings = {"logdir": notebooks.logdir_for(root, o.run, o.logdir)} if o.kind == "tensorboard" else {"dir": o.dir or root}
        folder, project = env.project_of()
        deps = notebooks.dependency_file(folder)
        notebooks.serve(conn, session.target, o.kind, settings, o.local_port, say, show(o.as_json), project=project, dependencies=deps)
    finally:
        session.close()


@task(
    help={
        "run": "show this run: its JOB_DIR and its working directory (default: every run under REMOTE_ROOT/runs)",
        "logdir": "a log directory on the host (relative paths are under REMOTE_ROOT/runs)",
        "local_port": LOCAL_HELP,
        "json": 'print {"url": ...}',
        "stack": STACK_HELP,
        "fetched": "TensorBoard here, over the fetched runs in runs/STACK/ (or --run's): no host needed, after down too",
    }
)
def tensorboard(
    c: Context,
    run: str | None = None,
    logdir: str | None = None,
    local_port: str | None = None,
    json_: bool = False,
    stack: str | None = None,
    fetched: bool = False,
) -> None:
    """TensorBoard on the host (the stack's Python, bound to localhost there), opened here; Ctrl-C stops both.

    With --fetched, on this machine over what `fetch` brought home (its own Python's TensorBoard)."""
    o = ServeOptions.read(
        "tensorboard", run=run, logdir=logdir, local_port=local_port, as_json=bool(json_), stack=stack, fetched=bool(fetched)
    )
    serve(Environment.of(c), o)


def _serve_fetched(env: Environment, o: ServeOptions) -> None:
    """TensorBoard on this machine over runs/STACK/[RUN] (fetched), on localhost, until Ctrl-C."""
    import importlib.util

    from gpu_train.stack import project as projects
    from remote.ssh.forward import pick_local_port
    from remote.tasks import notebooks
    from remote.tasks.trust import run_option

    name, _ = projects.choose_stack(
        o.stack, env.stack, projects.selected_stack(env.project_root), projects.stack_names([env.project_root / "stacks"])
    )
    if not name:
        raise UsageError("--fetched: which stack's runs? give --stack NAME")
    folder = env.project_root / "runs" / name / (run_option(o.run) or "")
    if not folder.is_dir():
        raise UsageError(f"--fetched: nothing fetched at {folder} (`{env.cli} fetch --stack {name}` brings runs home)")
    if importlib.util.find_spec("tensorboard") is None:
        raise UsageError(f"--fetched: TensorBoard is not installed here: {sys.executable} -m pip install tensorboard")
    say(f"tensorboard here over {folder}; Ctrl-C stops it")
    proc: subprocess.Popen[bytes] | None = None
    try:
        for tries_left in reversed(range(3)):
            port = o.local_port or pick_local_port(notebooks.DEFAULT_PORTS["tensorboard"])
            argv = [sys.executable, "-m", "tensorboard.main", "--logdir", str(folder), "--host", "127.0.0.1", "--port", str(port)]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
            if _answers_for(proc, port, folder):
                break
            _end(proc)
            proc = None
            if o.local_port or not tries_left:
                raise GpuTrainError(f"TensorBoard could not serve on 127.0.0.1:{port} (taken meanwhile?): give another --local-port")
        assert proc is not None
        show(o.as_json)(f"http://127.0.0.1:{port}/")
        proc.wait()
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP (the executor's stops_as_ctrl_c)
        pass
    finally:  # whatever ended the wait (or the start), TensorBoard ends with this command
        if proc is not None:
            _end(proc)


def _answers_for(proc: subprocess.Popen[bytes], port: int, folder: Path, within_s: float = 120) -> bool:
    """Whether TensorBoard ``proc`` came up on ``port`` serving ``folder`` (its /data/logdir says so), before it
    ended or ``within_s`` passed. The port was free when picked, but two commands started at once may both
    have picked it: the second's TensorBoard cannot listen and ends, and the URL would be the other's
    TensorBoard, over another project's runs. Only a URL that answers with this folder is shown."""
    import urllib.request

    from gpu_train.retry import Backoff

    wait = Backoff.within(within_s, 0.05, 0.5)
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # (an http_proxy without no_proxy would take 127.0.0.1 too)
    while proc.poll() is None and wait.left() > 0:
        try:
            with direct.open(f"http://127.0.0.1:{port}/data/logdir", timeout=5) as page:
                if json.loads(page.read()).get("logdir") == str(folder):
                    return True
        except (OSError, ValueError, AttributeError):
            pass
        time.sleep(wait.next())
    return False


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@task(
    help={
        "dir": "the notebook root on the host (default: REMOTE_ROOT)",
        "local_port": LOCAL_HELP,
        "json": 'print {"url": ...} (the URL carries the token)',
        "stack": STACK_HELP,
    }
)
def jupyter(c: Context, dir: str | None = None, local_port: str | None = None, json_: bool = False, stack: str | None = None) -> None:
    """JupyterLab on the host, opened here at a local URL with its token; Ctrl-C stops both.

    JupyterLab, else Notebook, else Jupyter Server, bound to localhost on the host."""
    serve(Environment.of(c), ServeOptions.read("jupyter", dir=dir, local_port=local_port, as_json=bool(json_), stack=stack))


@task(
    help={
        "port": "remote port (default 6006, TensorBoard)",
        "local_port": "local port (default: the same)",
        "json": 'print {"url": ...}',
        "stack": STACK_HELP,
    }
)
def tunnel(c: Context, port: str | None = None, local_port: str | None = None, json_: bool = False, stack: str | None = None) -> None:
    """Forward localhost:LOCAL_PORT to the host's 127.0.0.1:PORT over SSH (no firewall change).

    It first checks that something listens there; a busy local port is said as such."""
    from remote.tasks import notebooks

    # (port=None, not 6006: Invoke would parse an int default itself and fail on "abc" with a traceback)
    port_n = number("--port", 6006 if port is None else port, int, 1, 65535)
    local_n = number("--local-port", local_port, int, 1, 65535)
    session = Session(Environment.of(c), stack)
    try:
        notebooks.tunnel(session.connect(shared=False), session.target, port_n, local_n, say, show(json_))
    finally:
        session.close()
    sys.stdout.flush()
