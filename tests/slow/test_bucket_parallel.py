"""The slow tier of tests/unit/test_bucket_parallel.py (the same subject; its helpers are there): long real waits."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from agent import upload
from tests.gcs import Emulator, Throttle
from tests.unit.test_bucket_parallel import (
    BIG,
    PARTS,
    record,
    with_parts,
)
from tests.unit.test_bucket_upload import RUN, crc, run_dir, uploader


@pytest.mark.slow
def test_a_big_file_is_composed_from_parallel_parts_and_verified(tmp_path: Path, gcs: Emulator) -> None:
    d = run_dir(tmp_path)
    with_parts(d)
    data = os.urandom(BIG)
    (d / "job" / "big.bin").write_bytes(data)
    (d / "job" / "small.txt").write_text("one stream")
    proc = uploader(tmp_path)
    out, _ = proc.communicate(b"", timeout=120)
    assert proc.returncode == 0, out.decode()
    files = record(d)["files"]
    assert files["big.bin"]["crc32c"] == crc(data) and files["big.bin"]["size"] == BIG
    assert gcs.objects("p/") == {f"p/lab/{RUN}/big.bin": data, f"p/lab/{RUN}/small.txt": b"one stream"}  # no part left
    # (The emulator leaves a composite's componentCount unset, as Cloud Storage does not: the log says it.)
    assert "big.bin: 2 parts sent in parallel, composed into one object" in out.decode()


@pytest.mark.slow
def test_killed_mid_way_no_object_passes_for_the_file_and_the_next_start_clears_the_parts(
    tmp_path: Path, gcs: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = run_dir(tmp_path)
    with_parts(d)
    data = os.urandom(BIG)
    (d / "job" / "big.bin").write_bytes(data)
    name = f"p/lab/{RUN}/big.bin"
    slow = Throttle(gcs.port, 8 << 20)  # 8 MB/s a connection
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", slow.url)
    try:
        killed = uploader(tmp_path)
        killed.stdin.close()  # the job has ended: everything goes now
        slow.wait_sent(BIG // 2 + (4 << 20))  # one part complete, or both half-way
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert "big.bin" not in record(d)["files"]
        assert list(gcs.objects(f"p/lab/{RUN}/")) == [], "a partial object is in the bucket"
        # What it left is only parts, under the parts prefix (never listed as the run's): cleared at the next start.
        left = gcs.objects("p/")
        assert left and all(n.startswith(f"{PARTS}big.bin.part-") for n in left), list(left)

        termed = uploader(tmp_path)  # and SIGTERM (the machine going down) does not stop the parallel upload
        termed.stdin.close()
        start = slow.sent
        slow.wait_sent(start + (8 << 20))
        termed.send_signal(signal.SIGTERM)
        out = termed.stdout.read().decode()  # type: ignore[union-attr]  # (a PIPE: never None)
        termed.wait(timeout=120)
    finally:
        slow.stop()
    assert termed.returncode == 0, out
    assert "part(s) of an unfinished upload deleted" in out, out
    assert record(d)["final"] and record(d)["files"]["big.bin"]["crc32c"] == crc(data)
    assert gcs.objects("p/") == {name: data}
    assert upload.view(str(d))["onlyHost"] == []  # type: ignore[index]  # (None only for a run without a record)
