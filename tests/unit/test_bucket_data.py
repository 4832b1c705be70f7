"""The host's copy of the project's data from the bucket (`bucket-data`), against a real storage emulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from google.cloud import storage

from tests.conftest import ROOT
from tests.gcs import Emulator

RUN = "job_20260101_000000"
PREFIX = "p/data/proj/data/"


def pull(tmp_path: Path) -> subprocess.CompletedProcess:
    d = tmp_path / "root" / "runs" / RUN
    d.mkdir(parents=True, exist_ok=True)
    spec = {"runId": RUN, "base": "job", "project": "proj", "bucket": {"name": "ckpt", "prefix": f"p/lab/{RUN}/", "data": PREFIX}}
    (d / "spec.json").write_text(json.dumps(spec))
    argv = [sys.executable, "-m", "agent", "--root", str(tmp_path / "root"), "bucket-data", RUN]
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def test_many_files_come_down_verified_only_what_differs_and_a_failure_is_named(tmp_path: Path, gcs: Emulator) -> None:
    bucket = storage.Client().bucket("ckpt")
    want = {f"shard/{i:03d}.bin": os.urandom(1000 + i) for i in range(40)}
    want["meta.json"] = b'{"v": 2}'
    for name, data in want.items():
        bucket.blob(PREFIX + name).upload_from_string(data)
    data_dir = tmp_path / "root" / "data" / "proj"
    (data_dir / "shard").mkdir(parents=True)
    (data_dir / "meta.json").write_bytes(b'{"v": 1}')  # other bytes: replaced
    same = data_dir / "shard" / "000.bin"
    same.write_bytes(want["shard/000.bin"])  # the same bytes: left as it is
    inode = same.stat().st_ino

    r = pull(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "40 file(s) copied" in r.stdout
    assert {str(p.relative_to(data_dir)): p.read_bytes() for p in data_dir.rglob("*") if p.is_file()} == want
    assert same.stat().st_ino == inode

    bucket.blob(PREFIX + "shard/001.bin").upload_from_string(b"new")
    (data_dir / "shard" / "002.bin").unlink()
    (data_dir / "shard" / "002.bin").mkdir()  # in the way: that file cannot be put in place
    (data_dir / "shard" / "002.bin" / "x").write_text("the user's")
    r = pull(tmp_path)
    assert r.returncode == 1
    assert "shard/002.bin: IsADirectoryError" in r.stdout  # named, with the others still copied
    assert (data_dir / "shard" / "001.bin").read_bytes() == b"new"
    assert (data_dir / "shard" / "002.bin" / "x").read_text() == "the user's"
    assert not [p for p in data_dir.rglob("*gpu-train-part*")]
