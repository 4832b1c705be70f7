"""The uploader's last pass when the machine goes down: SIGTERM never stops it, from its first instant
(the booted-guest test, tests/guest/test_bucket_shutdown.py, takes it through systemd's stop); and it
runs at a lower CPU priority than the job."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from agent import upload
from tests.conftest import ROOT
from tests.gcs import Emulator
from tests.unit.test_bucket_upload import RUN, run_dir

AGENT_SHIM = f"""#!/usr/bin/env python3
import runpy, sys
sys.path.insert(0, {str(ROOT)!r})
runpy.run_module("agent", run_name="__main__")
"""


def test_sigterm_as_the_uploader_starts_does_not_stop_its_last_pass(tmp_path: Path, gcs: Emulator) -> None:
    d = run_dir(tmp_path)
    root = tmp_path / "root"
    (root / "bin").mkdir()
    (root / "bin" / "gpu-train-agent").write_text(AGENT_SHIM)  # where the wrapper finds the agent
    (d / "job" / "last.ckpt").write_bytes(b"written as the machine went down")
    proc = upload.start(str(root), str(d))  # as the wrapper starts it
    assert proc is not None and proc.stdin is not None
    assert os.getpriority(os.PRIO_PROCESS, proc.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + upload.NICE)
    proc.send_signal(signal.SIGTERM)  # the machine going down while it still imports Google's client
    proc.stdin.close()  # and the job ended
    assert proc.wait(timeout=60) == 0, (d / "upload.log").read_text()
    assert gcs.objects(f"p/lab/{RUN}/") == {f"p/lab/{RUN}/last.ckpt": b"written as the machine went down"}
    assert json.loads((d / "bucket.json").read_text())["final"]
