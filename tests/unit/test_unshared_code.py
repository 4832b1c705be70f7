"""No inode shared between two runs' working directories (agent/outputs.py::unshare, at every launch)."""

from __future__ import annotations

import os
from pathlib import Path

from agent import outputs


def test_a_job_rewriting_its_code_in_place_leaves_earlier_runs_code_alone(tmp_path: Path) -> None:
    """rsync's --link-dest (and a reused run's staging) hard-link unchanged files to the last run's:
    a job rewriting a code file in place rewrote every earlier run's copy through the shared inode."""
    first, staging = tmp_path / "runs" / "a" / "code", tmp_path / "staging" / "b"
    (first / "pkg").mkdir(parents=True)
    (first / "pkg" / "conf.py").write_text("lr = 0.1\n")
    (first / "train.py").write_text("print('train')\n")
    os.chmod(first / "train.py", 0o755)
    (first / "link").symlink_to("train.py")
    (staging / "pkg").mkdir(parents=True)
    for rel in ("pkg/conf.py", "train.py"):
        os.link(first / rel, staging / rel)  # as --link-dest leaves them
    (staging / "link").symlink_to("train.py")
    (staging / "new.py").write_text("x = 1\n")
    was = (first / "train.py").stat()

    assert outputs.unshare(str(staging)) == 2
    for rel in ("pkg/conf.py", "train.py"):
        mine, theirs = (staging / rel).stat(), (first / rel).stat()
        assert mine.st_ino != theirs.st_ino and mine.st_nlink == theirs.st_nlink == 1
        assert (mine.st_mode, mine.st_mtime_ns) == (theirs.st_mode, theirs.st_mtime_ns)
    with open(staging / "pkg" / "conf.py", "r+") as f:  # the job rewrites it in place
        f.write("lr = 9.9\n")
    assert (first / "pkg" / "conf.py").read_text() == "lr = 0.1\n"
    assert (first / "train.py").stat().st_ino == was.st_ino and (staging / "link").is_symlink()
    assert not list(staging.rglob("*.gpu-train-unshare"))
