"""The e2e tier of tests/unit/test_glance_tasks.py (the same subject; its helpers are there)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from remote.loopback import Sshd
from tests.conftest import ROOT
from tests.google_fake import FakeGoogle
from tests.unit.test_glance_tasks import FAB, T4, env, fab, gcp  # noqa: F401 (fixtures)


@pytest.mark.e2e  # a real sshd
def test_tensorboard_task_stopped_by_ctrl_c(env: dict, tmp_path: Path) -> None:
    sshd = Sshd(tmp_path / "sshd", "127.0.15.6").start()
    try:
        sshd.stack_file(Path(env["GPU_TRAIN_STACKS_DIR"]), "lab", tmp_path / "remote", sys.executable)
        proc = subprocess.Popen(
            [FAB, "--search-root", str(ROOT), "tensorboard", "--stack", "lab", "--json"],
            env=env,
            cwd=env["HOME"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        line = proc.stdout.readline()
        assert line.startswith("{"), proc.stderr.read() if proc.poll() is not None else line
        url = json.loads(line)["url"]
        assert url.startswith("http://127.0.0.1:")
        assert "<title>TensorBoard</title>" in urllib.request.urlopen(url, timeout=30).read().decode()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert "stopped tensorboard" in err and "Traceback" not in err
        pid = int(err.split("pid ")[1].split(",")[0])
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{pid}").exists(), "TensorBoard still runs on the host"
        # the first contact wrote the alias, and said so once
        assert "ssh alias: ssh gpu-train-lab" in err
    finally:
        sshd.stop()


@pytest.mark.e2e  # a real sshd
def test_vm_stop_refuses_while_a_run_runs_then_fetches_first(env: dict, gcp: FakeGoogle, tmp_path: Path) -> None:
    """The t4 'VM' is a real sshd on 127.0.15.7:22 (GCP stacks log in on port 22), so the guard talks to a real agent."""
    import socket

    try:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as sshd binds (TIME_WAIT is no listener)
            probe.bind(("127.0.15.7", 22))
    except OSError:
        pytest.skip("port 22 on 127.0.15.7 is taken (or this user may not bind it)")
    sshd = Sshd(tmp_path / "vm", "127.0.15.7")
    sshd.port = 22
    sshd.start()
    try:
        stack = tmp_path / "stacks" / "Pulumi.t4.yaml"
        stack.write_text(T4.format(key=f"{sshd.client_key}.pub") + f"  gpu-train:remoteRoot: {tmp_path / 'vmroot'}\n")
        outputs = json.loads((tmp_path / "state" / "t4" / "outputs.json").read_text())
        (tmp_path / "state" / "t4" / "outputs.json").write_text(
            json.dumps({**outputs, "externalIp": "127.0.15.7", "sshUser": sshd.user, "gpuCount": 0})
        )
        code = tmp_path / "code"
        code.mkdir()
        (code / "job.py").write_text(
            "import os, pathlib, time\npathlib.Path(os.environ['JOB_DIR'], 'ckpt').write_text('1')\ntime.sleep(120)\n"
        )
        started = fab(env, "train", "--stack", "t4", "--dir", str(code), "--script", "job.py")
        assert started.returncode == 0, started.stderr
        run = started.stdout.split()[1]
        ckpt = tmp_path / "vmroot" / "runs" / run / "job" / "ckpt"
        deadline = time.monotonic() + 60  # the job's checkpoint written (tasks now answer faster than a job starts)
        while not ckpt.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        refused = fab(env, "vm-stop", "--stack", "t4")
        assert refused.returncode == 1 and f"refusing: still running: {run}" in refused.stderr, refused.stderr
        assert not (tmp_path / "pulumi" / "calls").exists()  # no pulumi at all (the outputs are the train's, kept): no `up`
        assert fab(env, "stop", "--stack", "t4", "--grace", "1").returncode == 0
        stopped = fab(env, "vm-stop", "--stack", "t4")
        assert stopped.returncode == 0, stopped.stderr
        assert (tmp_path / "runs" / "t4" / run / "ckpt").read_text() == "1"  # fetched, into the project, before the VM stopped
        assert not (Path(env["HOME"]) / "runs").exists()
        assert "config set gpu-train:running false --stack t4" in (tmp_path / "pulumi" / "calls").read_text()
    finally:
        sshd.stop()
