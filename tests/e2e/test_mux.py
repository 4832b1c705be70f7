"""Connection reuse over a real sshd on loopback: a task after another opens a channel on this user's
shared OpenSSH connection (remote/ssh/mux.py) and logs in no more; train (sync and launch), status and
logs --follow work over it. This suite's loopback addresses are 127.0.24.x.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from gpu_train.environment import Environment
from remote.loopback import Sshd
from remote.ssh import mux
from remote.ssh.target import resolve
from tests.conftest import fab_env, run_fab
from tests.pyindex import OFFLINE_INDEX

ADDRESS = "127.0.24.1"


@pytest.mark.e2e
def test_a_second_task_rides_on_the_first_ones_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sshd = Sshd(tmp_path / "sshd", ADDRESS, setenv=f"PIP_INDEX_URL={OFFLINE_INDEX}", log_level="INFO").start()
    path = None
    try:
        sshd.stack_file(tmp_path / "stacks", "lab", tmp_path / "remote", "/usr/bin/python3")
        env = fab_env(tmp_path / "stacks", tmp_path / "home", "lab", tmp_path / "proj")
        (tmp_path / "proj").mkdir()
        (tmp_path / "proj" / "job.py").write_text("print('job ran', flush=True)\n")

        def logins() -> int:
            return (sshd.dir / "sshd.log").read_text().count("Accepted publickey")

        run_fab(env, tmp_path / "proj", "status", check=True)  # first contact: a login, and the shared one beside it
        target = resolve(Environment.from_os(env), "lab").for_node(0)
        path = mux.control_path(target, target.host)
        assert path is not None
        deadline = time.monotonic() + 20
        while not mux.master_up(path) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mux.master_up(path)
        assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
        before = logins()

        status = json.loads(run_fab(env, tmp_path / "proj", "status", "--json", check=True).stdout)
        assert status["runs"] == []
        train = run_fab(env, tmp_path / "proj", "train", "--script", "job.py", "--follow", check=True)
        assert "job ran" in train.stdout  # code synced, launched and its log streamed, all over the shared connection
        logs = run_fab(env, tmp_path / "proj", "logs", check=True)
        assert "job ran" in logs.stdout
        assert logins() == before  # three tasks, no login
    finally:
        sshd.stop()
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)
