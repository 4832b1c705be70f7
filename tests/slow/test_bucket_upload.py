"""The slow tier of tests/unit/test_bucket_upload.py (the same subject; its helpers are there): long real waits."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from agent import upload
from tests.gcs import Emulator, Throttle
from tests.unit.test_bucket_upload import (
    RUN,
    crc,
    run_dir,
    uploader,
)


@pytest.mark.slow
def test_sigkill_mid_upload_leaves_no_object_and_sigterm_finishes_it(
    tmp_path: Path, gcs: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = run_dir(tmp_path)
    data = os.urandom(24 << 20)  # past the client's 8 MiB: a resumable upload, in chunks
    (d / "job" / "big.bin").write_bytes(data)
    name = f"p/lab/{RUN}/big.bin"
    slow = Throttle(gcs.port, 8 << 20)  # 8 MB/s: three seconds for the file
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", slow.url)
    try:
        killed = uploader(tmp_path)
        killed.stdin.close()  # the job has ended: everything goes now, settled or not
        slow.wait_sent(10 << 20)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        record = json.loads((d / "bucket.json").read_text())
        assert "big.bin" not in record["files"]
        assert name not in gcs.objects(f"p/lab/{RUN}/"), "a partial object is in the bucket"

        termed = uploader(tmp_path)
        termed.stdin.close()
        start = slow.sent
        slow.wait_sent(start + (10 << 20))
        termed.send_signal(signal.SIGTERM)  # the machine going down: the upload in flight completes
        out = termed.stdout.read().decode()  # type: ignore[union-attr]  # (a PIPE: never None)
        termed.wait(timeout=120)
    finally:
        slow.stop()
    assert termed.returncode == 0, out
    record = json.loads((d / "bucket.json").read_text())
    assert record["final"] and record["files"]["big.bin"]["crc32c"] == crc(data)
    assert gcs.objects(f"p/lab/{RUN}/") == {name: data}
    assert upload.view(str(d))["onlyHost"] == []  # type: ignore[index]  # (None only for a run without a record)
