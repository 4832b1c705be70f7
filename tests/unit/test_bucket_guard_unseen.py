"""`down --no-fetch` trusts the host's word that the bucket holds everything: what the host cannot read
(a root-owned folder a container wrote, a file of mode 000) is named as only on the host, never left out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux)")
def test_what_the_host_cannot_read_is_only_on_the_host(tmp_path: Path) -> None:
    run_dir = tmp_path / "root" / "runs" / "r_20260101_000000"
    (run_dir / "job" / "ckpts").mkdir(parents=True)
    (run_dir / "job" / "ckpts" / "step1.pt").write_bytes(b"x")
    (run_dir / "job" / "model.tmp.pt").write_bytes(b"y")  # a finished file with ".tmp." in its name
    (run_dir / "job" / "ok.txt").write_bytes(b"z")
    (run_dir / "code").mkdir()
    (run_dir / "job" / "ckpts").chmod(0)
    record = {"files": {"ok.txt": {"size": 1, "mtimeNs": (run_dir / "job" / "ok.txt").stat().st_mtime_ns}}}
    try:
        # as the host's login user, not root: root reads mode 000 (the sshd of tests/e2e/test_outputs' blind_lab)
        out = subprocess.run(
            [
                "setpriv",
                "--bounding-set",
                "-dac_override,-dac_read_search",
                "--",
                sys.executable,
                "-c",
                "import json,sys; from agent import upload; "
                f"print(json.dumps(upload.only_on_host({str(run_dir)!r}, json.loads(sys.argv[1]))))",
                json.dumps(record),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        (run_dir / "job" / "ckpts").chmod(0o755)
    assert out.returncode == 0, out.stderr
    only = json.loads(out.stdout)
    assert "model.tmp.pt" in only and "ok.txt" not in only
    assert any(line.startswith("ckpts (unreadable on the host") for line in only), only


def test_what_the_bucket_lacks_of_the_record_is_named() -> None:
    from remote.tasks.bucketguard import differs_in_bucket, expected_objects

    rec = {
        "a": {"generation": 5, "size": 3, "crc32c": "AAAA", "mtimeNs": 1},
        "b": {"generation": 6, "size": 1, "crc32c": "BBBB", "mtimeNs": 1},
    }
    want = expected_objects(rec, "p/lab/r_1/")
    assert differs_in_bucket(want, {"p/lab/r_1/a": (5, 3, "AAAA"), "p/lab/r_1/b": (6, 1, "BBBB")}, "r_1") == []
    assert differs_in_bucket(want, {"p/lab/r_1/a": (5, 3, "AAAA")}, "r_1") == ["r_1: not in the bucket: p/lab/r_1/b"]
    assert differs_in_bucket(want, {"p/lab/r_1/a": (7, 3, "AAAA"), "p/lab/r_1/b": (6, 1, "BBBB")}, "r_1") == [
        "r_1: another version in the bucket: p/lab/r_1/a (generation 7, 3 bytes; verified was 5, 3 bytes)"
    ]
    assert differs_in_bucket(want, {"p/lab/r_1/a": (5, 3, "CCCC"), "p/lab/r_1/b": (6, 1, "BBBB")}, "r_1")[0].startswith(
        "r_1: another version"
    )


def test_down_no_fetch_lists_the_bucket_itself(gcs) -> None:
    """Against the real emulator: what the host recorded must be there, at its generation, in a folder of
    this stack's (its area, or for a run from before areas its name's), whatever else the host says."""
    from types import SimpleNamespace

    from remote.tasks.teardown import not_as_recorded

    bucket = gcs.client().bucket("ckpt")
    run, old = "job_20260101_000000", "job_20251231_000000"
    record, old_record = {}, {}
    for rel in ("a.txt", "eval/b.txt"):
        for name, rec in (
            (f"team/.gpu-train-runs/lab@0000beef/{run}/{rel}", record),
            (f"team/.gpu-train-runs/lab/{old}/{rel}", old_record),
        ):
            blob = bucket.blob(name)
            blob.upload_from_string(rel.encode())
            rec[rel] = {"generation": int(blob.generation), "size": int(blob.size), "crc32c": blob.crc32c, "mtimeNs": 1}
    lab = SimpleNamespace(stack="lab", bucket_area="lab@0000beef")
    url = f"gs://ckpt/team/.gpu-train-runs/lab@0000beef/{run}/"
    docs: list[object] = [
        {
            "runs": [
                {"id": run, "bucket": {"final": True, "url": url}, "bucketRecord": record},
                {"id": old, "bucket": {"final": True, "url": f"gs://ckpt/team/.gpu-train-runs/lab/{old}/"}, "bucketRecord": old_record},
            ]
        }
    ]
    assert not_as_recorded(lab, "gs://ckpt/team", docs) == []  # the run from before areas too, in its old folder
    other = SimpleNamespace(stack="lab", bucket_area="lab@0000cafe")  # another `lab` on this bucket: neither is in its folders
    assert not_as_recorded(other, "gs://ckpt/team", docs) == [
        f"{run}: the host says it went to {url}, no folder of this stack's",
    ]
    bucket.blob(f"team/.gpu-train-runs/lab@0000beef/{run}/eval/b.txt").delete()
    assert not_as_recorded(lab, "gs://ckpt/team", docs) == [f"{run}: not in the bucket: team/.gpu-train-runs/lab@0000beef/{run}/eval/b.txt"]
    bucket.blob(f"team/.gpu-train-runs/lab@0000beef/{run}/a.txt").upload_from_string(b"a.txt")  # the same bytes, another generation
    (line,) = [x for x in not_as_recorded(lab, "gs://ckpt/team", docs) if "another version" in x]
    assert line.startswith(f"{run}: another version in the bucket: team/.gpu-train-runs/lab@0000beef/{run}/a.txt")
    no_record: list[object] = [{"runs": [{"id": run, "bucket": {"final": True, "url": url}}]}]
    assert not_as_recorded(lab, "gs://ckpt/team", no_record) == [f"'{run}': the host did not say what it verified in the bucket"]


def test_a_link_out_of_the_run_is_only_on_the_host(tmp_path: Path) -> None:
    """A checkpoint folder linked to a scratch disk (a common layout): neither the uploader nor `down`
    counted what it points to, and both went ahead."""
    from agent import upload

    run_dir = tmp_path / "root" / "runs" / "r_20260101_000000"
    job, code, scratch = run_dir / "job", run_dir / "code", tmp_path / "scratch"
    job.mkdir(parents=True)
    code.mkdir()
    (scratch / "ckpt").mkdir(parents=True)
    (scratch / "ckpt" / "step1.pt").write_bytes(b"weights")
    (scratch / "best.pt").write_bytes(b"best")
    (job / "ckpt").symlink_to(scratch / "ckpt")  # a folder out of the run
    (job / "best.pt").symlink_to(scratch / "best.pt")  # a file out of the run
    (job / "a.txt").write_text("a")
    (job / "latest").symlink_to("a.txt")  # inside the run: its content is a.txt's
    (job / "gone").symlink_to(tmp_path / "nothing")  # points at nothing: nothing to lose
    (code / "out").symlink_to(scratch)  # the working directory's outputs folder on scratch
    record = {"files": {"a.txt": {"size": 1, "mtimeNs": (job / "a.txt").stat().st_mtime_ns}}}
    only = upload.only_on_host(str(run_dir), record)
    assert sorted(o.split(" (")[0] for o in only) == ["best.pt", "ckpt", "workdir/out"], only
    assert all("a link out of the run" in o for o in only)
    assert upload.scan(str(run_dir)) == {"a.txt": (1, (job / "a.txt").stat().st_mtime_ns)}  # never uploaded through it


def test_the_bucket_record_comes_only_when_asked(tmp_path: Path) -> None:
    """One entry per file: `down --no-fetch` asks for it, the dashboard's frequent status never carries it."""
    run = "r_20260101_000000"
    run_dir = tmp_path / "root" / "runs" / run
    (run_dir / "job").mkdir(parents=True)
    (run_dir / "state.json").write_text(json.dumps({"id": run, "state": "succeeded", "created": 1.0}))
    (run_dir / "spec.json").write_text(json.dumps({"runId": run, "base": "r", "bucket": {"name": "ckpt", "prefix": f"t/lab/{run}/"}}))
    rec = {"a.txt": {"size": 1, "mtimeNs": 1, "crc32c": "AAAA", "generation": 7}}
    (run_dir / "bucket.json").write_text(json.dumps({"files": rec, "final": True}))

    def status(*flags: str) -> dict:
        argv = [sys.executable, "-m", "agent", "--root", str(tmp_path / "root"), "status", *flags]
        out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["runs"][0]

    assert "bucketRecord" not in status("--summaries")
    assert status("--summaries", "--bucket-record")["bucketRecord"] == rec
