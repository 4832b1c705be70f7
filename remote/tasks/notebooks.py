"""`tensorboard`, `jupyter` and `tunnel`: a server on the host, reachable on the laptop's localhost.

The server runs on the host bound to 127.0.0.1 (``serve_host.py``, sent with the call), and one
forward over the task's own SSH connection makes it http://127.0.0.1:PORT/ here. Ctrl-C closes the
channel; the host side sees its stdin close and stops the server's whole process group, so nothing
keeps running (or listening) after the task ends, and a dropped connection does the same.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_train.errors import printable, printable_doc
from gpu_train.ownership import project_dirs
from remote.ssh.agentcall import LINE_MAX
from remote.ssh.forward import ForwardError, LocalForward, pick_local_port, remote_listens

if TYPE_CHECKING:
    import paramiko

    from remote.ssh.target import Target

HOST_SCRIPT = Path(__file__).resolve().parents[2] / "agent" / "serve.py"
DEFAULT_PORTS = {"tensorboard": 6006, "jupyter": 8888}


def logdir_for(remote_root: str, run: str | None, logdir: str | None) -> str:
    """--logdir as given (relative paths are under REMOTE_ROOT/runs), else the run's folder (its JOB_DIR, job/,
    and its working directory, code/, where a job that logs to its own out/ writes its events), else every run."""
    runs = f"{remote_root.rstrip('/')}/runs"
    if logdir:
        return logdir if logdir.startswith(("/", "~")) else f"{runs}/{logdir}"
    return f"{runs}/{run}" if run else runs


def host_command(python: str | None) -> str:
    """The host script's command line: the script only. Its spec (Jupyter's token) goes on stdin, since
    every user of the host reads command lines in /proc."""
    return f"{shlex.quote(python or 'python3')} -c {shlex.quote(HOST_SCRIPT.read_text())}"


def env_python(target: Target, project: str) -> str:
    """The ``project``'s venv's Python on the host (where the runs install requirements.txt when it exists)."""
    return f"{project_dirs(target.remote_root, project)[0]}/bin/python"


def dependency_file(folder: Path) -> str:
    """The file a train installs the project's packages from, where a server missing on the host is to be
    added: requirements.txt, else pyproject.toml (its dependencies, or its uv.lock: agent/pyenv.py)."""
    return next((name for name in ("requirements.txt", "pyproject.toml") if (folder / name).is_file()), "requirements.txt")


def url_for(kind: str, port: int, token: str | None) -> str:
    """Where the forwarded server answers: Jupyter with its token, TensorBoard under its secret path."""
    if not token:
        return f"http://127.0.0.1:{port}/"
    return f"http://127.0.0.1:{port}/?token={token}" if kind == "jupyter" else f"http://127.0.0.1:{port}/{token}/"


def serve(
    conn: Any,  # (a Fabric Connection: untyped)
    target: Target,
    kind: str,
    spec_extra: dict[str, Any],
    local_port: int | None,
    say: Callable[[str], None],
    show: Callable[[str], None],
    wait: Callable[[], None] | None = None,
    *,
    project: str,
    dependencies: str = "requirements.txt",
) -> None:
    """Start ``kind`` on the host, forward it, print its URL, and stop both when interrupted; ``project``:
    the project's name on the host (its venv's Python runs the server when it has one); ``dependencies``:
    the project's file of packages (dependency_file), named where the server is missing."""
    # Both ends listen on a loopback port every local user may connect to (the host's server, this
    # laptop's forward): a secret only this user sees (Jupyter's token, TensorBoard's path) is the lock.
    token = secrets.token_hex(24)
    spec = {
        "kind": kind,
        "python": target.python,
        "root": target.remote_root,
        "token": token or "",
        "envPython": env_python(target, project),
        "venv": target.venv,
        "dependencies": dependencies,
        **spec_extra,
    }
    transport = conn.client.get_transport()
    chan = transport.open_session()
    chan.exec_command(host_command(target.python))
    chan.sendall(json.dumps(spec).encode() + b"\n")
    try:
        line = chan.makefile("rb").readline(LINE_MAX)  # a host's answer: bounded
        try:
            raw = json.loads(line)
            doc = printable_doc(raw)
        except ValueError:
            err = chan.makefile_stderr("rb").read(4000).decode("utf-8", "replace") if chan.exit_status_ready() else ""
            raise ForwardError(f"{kind} could not be started on {target.host}: {err.strip() or line!r}") from None
        if "error" in doc:  # the server's log as lines (its control characters written out)
            raise ForwardError(printable(str(raw["error"]), keep="\n\t"))
        port = pick_local_port(DEFAULT_PORTS[kind]) if local_port is None else int(local_port)
        forward = LocalForward(transport, doc["port"], port)
        try:
            show(url_for(kind, forward.port, token))
            say(
                f"{doc['module']} on {target.host} (127.0.0.1:{doc['port']}, pid {doc['pid']}, {doc['python']}, "
                f"log {doc['log']}); Ctrl-C stops it"
            )
            with contextlib.suppress(KeyboardInterrupt):
                (wait or (lambda: _until_closed(chan)))()
        finally:
            forward.close()
    finally:
        if not chan.closed:
            chan.shutdown_write()  # EOF on the host script's stdin: it stops the server's process group
            deadline = time.monotonic() + 15
            while not chan.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.1)
            chan.close()
    say(f"stopped {kind} on {target.host}")


def _until_closed(chan: paramiko.Channel) -> None:
    while not chan.exit_status_ready():
        time.sleep(0.5)
    raise ForwardError("the server on the host stopped by itself (see its log)")


def tunnel(
    conn: Any,  # (a Fabric Connection: untyped)
    target: Target,
    port: int,
    local_port: int | None,
    say: Callable[[str], None],
    show: Callable[[str], None],
    wait: Callable[[], None] | None = None,
) -> None:
    """Forward localhost:LOCAL to the host's 127.0.0.1:PORT, after checking that something listens there."""
    transport = conn.client.get_transport()
    if not remote_listens(transport, port):
        raise ForwardError(
            f"nothing listens on {target.host.host} 127.0.0.1:{port}: start the server there first "
            "(or `gpu-train tensorboard` / `gpu-train jupyter`, which start one and tunnel it)"
        )
    forward = LocalForward(transport, port, port if local_port is None else int(local_port))
    try:
        show(f"http://127.0.0.1:{forward.port}/")
        say(f"-> {target.host} 127.0.0.1:{port} (Ctrl-C to stop)")
        with contextlib.suppress(KeyboardInterrupt):
            (wait or _forever)()
    finally:
        forward.close()


def _forever() -> None:
    while True:
        time.sleep(3600)
