"""Runs on the host (standard library only): start TensorBoard or Jupyter on localhost, for as long as
the laptop's SSH channel stays open.

Sent with the call (``python3 -c``) by `gpu-train tensorboard` / `jupyter`; the spec (Jupyter's
token) comes as the first line of stdin, never on the command line, which every user of the host
can read. It picks the Python that has the server (the project's venv where the runs made one, else
the stack's, else the Deep Learning VM's conda, else python3), a free port on 127.0.0.1 (never on a
public address: the tunnel is the only way in), starts the server in its own process group, waits
until it accepts connections, and
answers one JSON line. Then it waits for its stdin to close, which happens when the laptop stops
(Ctrl-C) or its connection drops, and stops the whole group: no server is left behind.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any

MODULES = {"tensorboard": ["tensorboard.main"], "jupyter": ["jupyterlab", "notebook", "jupyter_server"]}


def has_module(python: str, module: str) -> bool:
    try:
        return subprocess.run([python, "-c", f"import {module}"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def choose(spec: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """(python, module) for the server, or an error text. The run's environment first: the project's
    venv where the runs made one, then the stack's Python (else the Deep Learning VM's conda, else python3)."""
    env_python = spec.get("envPython")
    base = [spec["python"]] if spec.get("python") else ["/opt/conda/bin/python", "python3"]
    has_env = isinstance(env_python, str) and bool(env_python) and os.access(env_python, os.X_OK)
    candidates: list[str] = ([env_python] if has_env else []) + base
    for python in candidates:
        for module in MODULES[spec["kind"]]:
            if has_module(python, module):
                return python, module, None
    wanted = "tensorboard" if spec["kind"] == "tensorboard" else "jupyterlab"
    into = env_python if has_env or spec.get("venv") else base[0]
    # where the project lists what a train installs (a requirements.txt added to a uv project would replace its uv.lock)
    where = (
        "your requirements.txt"
        if spec.get("dependencies", "requirements.txt") == "requirements.txt"
        else (f"pyproject.toml's dependencies (`uv add {wanted}` writes uv.lock too)")
    )
    return (
        None,
        None,
        f"no {wanted} in {' or '.join(candidates)} on this host: add {wanted} to {where} "
        f"(the next train installs it into {into}, the jobs' Python)",
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# TensorBoard has no token: it answers only under a secret path prefix, given by environment (a
# command line is readable by every user of the host), so it is started through its Python API.
TENSORBOARD = (
    "import os, sys\nfrom tensorboard import program\ntb = program.TensorBoard()\n"
    "tb.configure(argv=[*sys.argv, '--path_prefix', '/' + os.environ.pop('GPU_TRAIN_SECRET')])\n"
    "sys.exit(tb.main())\n"
)


def argv_for(spec: dict[str, Any], python: str, module: str, port: int, uid: int | None = None) -> list[str]:
    """The server's command line; Jupyter refuses a root login without --allow-root (rented and container
    GPU boxes log in as root: the token and the loopback binding guard it as they do any other login)."""
    if spec["kind"] == "tensorboard":
        return [python, "-c", TENSORBOARD, "--logdir", spec["logdir"], "--host", "127.0.0.1", "--port", str(port)]
    return [
        python,
        "-m",
        module,
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={spec['dir']}",
        *(["--allow-root"] if (os.geteuid() if uid is None else uid) == 0 else []),
    ]


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def first_line(fd: int = 0, limit: int = 1 << 20) -> bytes:
    """The spec's line, read byte by byte (stdin stays unbuffered for the wait on its end below)."""
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        byte = os.read(fd, 1)
        if not byte:
            break
        data += byte
    return data


def main() -> int:
    spec = json.loads(first_line())
    for key in ("root", "logdir", "dir", "envPython"):
        if spec.get(key):
            spec[key] = os.path.expanduser(spec[key])
    for sig in (signal.SIGTERM, signal.SIGHUP):  # sshd ending the session: stop the server too
        signal.signal(sig, lambda *_: sys.exit(1))
    python, module, error = choose(spec)
    if error or python is None or module is None:  # (choose gives a server or why there is none)
        print(json.dumps({"error": error}), flush=True)
        return 1
    for path in (spec.get("logdir"), spec.get("dir")):
        if path:
            os.makedirs(path, exist_ok=True)
    port = free_port()
    log_path = os.path.join(spec["root"], f"{spec['kind']}.log")
    os.makedirs(spec["root"], exist_ok=True)
    # Not on the command line, where ps shows it: Jupyter's token, TensorBoard's path prefix.
    env = dict(os.environ, JUPYTER_TOKEN=spec.get("token", ""), GPU_TRAIN_SECRET=spec.get("token", ""))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv_for(spec, python, module, port),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env=env,
            cwd=spec.get("dir") or spec["root"],
        )
    deadline = time.monotonic() + float(spec.get("startTimeoutS", 180))
    while not listening(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            with open(log_path, "rb") as f:
                tail = f.read()[-1500:].decode("utf-8", "replace")
            print(json.dumps({"error": f"{module} did not start (log {log_path}):\n{tail}"}), flush=True)
            return 1
        time.sleep(0.2)
    print(json.dumps({"port": port, "pid": proc.pid, "python": python, "module": module, "log": log_path}), flush=True)
    try:
        while proc.poll() is None:
            ready, _, _ = select.select([sys.stdin], [], [], 1.0)
            if ready and not os.read(sys.stdin.fileno(), 4096):
                break  # stdin closed: the laptop is gone
    finally:
        stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
