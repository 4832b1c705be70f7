"""A train of unchanged code on a host whose GPUs are not there yet (a VM's driver still loading).

The laptop's launch of one node (remote/tasks/launching.py) over a real sshd: the host answers
"waiting" before it reuses anything, and the laptop must try the launch again, sync or reuse
included, rather than assume the code is staged. `nvidia-smi -L` stands in for the driver: it lists
no GPU on its first call, one after (there is no GPU on this machine).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from gpu_train import jobs
from gpu_train.environment import Environment
from remote.loopback import Sshd
from tests.conftest import fab_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ADDRESS = "127.0.55.2"
# nvidia-smi while the driver loads: once $SMI_LOADING exists, no GPU on the first `-L`, one on every later one.
LATE_SMI = """#!/bin/sh
case "$*" in
  *-L*) if [ -e "$SMI_LOADING" ] && [ ! -e "$SMI_LOADING.seen" ]; then : > "$SMI_LOADING.seen";
        else echo "GPU 0: Tesla T4 (UUID: GPU-00000000)"; fi ;;
esac
"""


def _ended(root: Path, run: str) -> None:
    state, deadline = root / "runs" / run / "state.json", time.monotonic() + 60
    while not state.exists() or json.loads(state.read_text()).get("state") not in ("succeeded", "failed", "stopped"):
        assert time.monotonic() < deadline, f"{run} did not end"
        time.sleep(0.05)


@pytest.mark.e2e
def test_unchanged_code_is_launched_once_the_gpus_are_there(tmp_path: Path) -> None:
    from remote.tasks import launching
    from remote.tasks.session import Session
    from remote.transfer import sync

    fakebin, loading = tmp_path / "fakebin", tmp_path / "smi-loading"
    fakebin.mkdir()
    (fakebin / "nvidia-smi").write_text(LATE_SMI)
    (fakebin / "nvidia-smi").chmod(0o755)
    sshd = Sshd(tmp_path / "sshd", ADDRESS, setenv=f"PATH={fakebin}:{os.defpath} SMI_LOADING={loading}").start()
    try:
        root, code, cwd = tmp_path / "remote", tmp_path / "code", tmp_path / "work"
        code.mkdir()
        cwd.mkdir()
        (code / "a.py").write_text("print(1)\n")
        sshd.stack_file(tmp_path / "stacks", "lab", root, sys.executable)
        env = Environment.from_os(fab_env(tmp_path / "stacks", tmp_path / "home", "lab", cwd))
        plan = sync.plan_code(code, tmp_path / "scratch", ())

        def launch(run: str, unchanged: bool, gpus: int) -> dict:
            session = Session(env, "lab")
            session = Session(env, None, 30, 0, dataclasses.replace(session.cluster, expect_gpus=gpus))
            spec = jobs.job_spec(
                run=run, base="re", script=None, command="cat a.py", args="", env=[], python=sys.executable, expect_gpus=gpus, code_dir=code
            )
            try:
                return dict(launching._launch_node(session, plan, spec, unchanged, None, threading.Event()))
            finally:
                session.close()

        first = launch("re_20250101_000000", False, 0)  # a first run: the host keeps its code
        _ended(root, first["runId"])
        # The same code again, on a host whose driver is loading: "waiting" first, then launched with it.
        loading.touch()
        second = launch("re_20250101_000001", True, 1)
        assert (tmp_path / "smi-loading.seen").exists()  # (the first answer was "waiting")
        assert (root / "runs" / second["runId"] / "code" / "a.py").read_text() == "print(1)\n"
        _ended(root, second["runId"])
    finally:
        sshd.stop()
