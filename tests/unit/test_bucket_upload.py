"""The host's uploader (agent/upload.py) against a real storage emulator, without sshd."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import google_crc32c

from agent import upload
from tests.conftest import ROOT

RUN = "job_20260101_000000"


def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "root" / "runs" / RUN
    (d / "job").mkdir(parents=True)
    (d / "code").mkdir()
    (d / "spec.json").write_text(json.dumps({"runId": RUN, "base": "job", "bucket": {"name": "ckpt", "prefix": f"p/lab/{RUN}/"}}))
    return d


def uploader(tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "--root", str(tmp_path / "root"), "upload", RUN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def crc(data: bytes) -> str:
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


def test_settled_files_only_then_everything_at_the_end() -> None:
    seen: dict = {}
    current = {"a": (1, 10), "b": (2, 20)}
    assert upload.due(current, seen, {}, 100.0, final=False) == []  # just seen: not settled yet
    current["b"] = (3, 30)  # b is still being written
    assert upload.due(current, seen, {}, 100.0 + upload.SETTLE_S, final=False) == ["a"]
    done = {"a": {"size": 1, "mtimeNs": 10, "crc32c": "x", "generation": 1}}
    assert upload.due(current, seen, done, 100.0 + upload.SETTLE_S, final=True) == ["b"]  # a is there as it is


def test_status_says_what_is_only_on_the_host() -> None:
    from remote.tasks.render import bucket_line

    b = {"url": "gs://ckpt/p/lab/r/", "files": 2, "onlyHost": ["ckpt-3.pt", "a", "b", "c"], "final": False, "error": None}
    assert bucket_line("r", b) == "  r: 2 file(s) in gs://ckpt/p/lab/r/ (verified); only on the host: 4 (ckpt-3.pt, a, b, ...)"
    assert bucket_line("r", {**b, "onlyHost": [], "final": True}).endswith("(verified); nothing only on the host")


def test_down_without_a_download_needs_every_run_verified_in_the_bucket() -> None:
    from remote.tasks.bucketguard import not_in_bucket

    ok = {"id": "a", "bucket": {"files": 2, "onlyHost": [], "final": True, "error": None}}
    assert not_in_bucket([{"runs": [ok]}]) == []
    assert not_in_bucket([{"runs": [ok, {"id": "old"}]}]) == ["old: not in the bucket (it started before gpu-train:bucket was set)"]
    late = {"id": "b", "bucket": {"files": 1, "onlyHost": ["x.pt"], "final": True}}
    busy = {"id": "c", "bucket": {"files": 1, "onlyHost": [], "final": False, "error": "503"}}
    assert not_in_bucket([{"runs": [late]}, {"runs": [busy]}, None]) == [
        "node 0: b: only on the host: x.pt",
        "node 1: c: its last upload has not finished (503)",
        "node 2: could not be asked",
    ]


def test_an_uploader_that_cannot_start_leaves_the_job_alone_and_says_why(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    spec = json.loads((d / "spec.json").read_text())
    (d / "spec.json").write_text(json.dumps({**spec, "python": str(tmp_path / "no-python")}))
    assert upload.start(str(tmp_path / "root"), str(d)) is None
    view = upload.view(str(d))
    assert view is not None and "the uploader did not start" in str(view["error"]) and not view["final"]
