"""A big file goes to the bucket in parts sent in parallel, composed into its object
(agent/composite.py): against a real storage emulator, and killed mid-way."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from agent import composite, upload
from gpu_train.jobs import in_bucket
from gpu_train.stack.bucket import PARTS_FOLDER
from tests.gcs import Emulator, Throttle
from tests.unit.test_bucket_upload import RUN, crc, run_dir, uploader

PARTS = f"p/{PARTS_FOLDER}lab/{RUN}/"
BIG = composite.PARALLEL_FROM + (16 << 20)  # past the threshold: parts


@pytest.mark.parametrize(
    ("size", "want"),
    [
        (0, [(0, 0)]),
        (composite.PARALLEL_FROM - 1, [(0, composite.PARALLEL_FROM - 1)]),  # below the threshold: one stream
        (64 << 20, [(0, 32 << 20), (32 << 20, 32 << 20)]),
        (100 << 20, [(0, 34952534), (34952534, 34952534), (69905068, 34952532)]),  # 3 parts of at least PART_MIN
        (10 << 30, [(i * (320 << 20), 320 << 20) for i in range(32)]),  # never more than compose takes (32)
    ],
)
def test_a_file_is_cut_into_parts_above_the_threshold_never_more_than_compose_takes(size: int, want: list) -> None:
    assert composite.PARALLEL_FROM == 64 << 20 and composite.PART_MIN == 32 << 20
    got = composite.slices(size)
    assert got == want
    assert sum(length for _, length in got) == size and len(got) <= 32


def test_parts_go_beside_the_stacks_runs_and_never_past_cloud_storages_name_limit() -> None:
    from gpu_train.contract import JobSpec

    spec = in_bucket([JobSpec(run_id="r1", base="runs/r1", project="proj")], "lab", "gs://ckpt/team")[0]
    assert spec.bucket == {"name": "ckpt", "prefix": "team/lab/r1/", "data": "team/data/proj/", "parts": "team/.gpu-train-parts/lab/r1/"}
    assert composite.part_names("team/.gpu-train-parts/lab/r1/", "ck/a.pt", 3) == [
        f"team/.gpu-train-parts/lab/r1/ck/a.pt.part-{i:02d}-of-03" for i in range(3)
    ]
    assert composite.part_names("p/", "x" * 1010, 2) is None  # the file goes as one stream


def record(d: Path) -> dict:
    return json.loads((d / "bucket.json").read_text())


def with_parts(d: Path) -> None:
    spec = json.loads((d / "spec.json").read_text())
    spec["bucket"]["parts"] = PARTS
    (d / "spec.json").write_text(json.dumps(spec))


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
        out = termed.stdout.read().decode()  # type: ignore[union-attr]
        termed.wait(timeout=120)
    finally:
        slow.stop()
    assert termed.returncode == 0, out
    assert "part(s) of an unfinished upload deleted" in out, out
    assert record(d)["final"] and record(d)["files"]["big.bin"]["crc32c"] == crc(data)
    assert gcs.objects("p/") == {name: data}
    assert upload.view(str(d))["onlyHost"] == []  # type: ignore[index]
