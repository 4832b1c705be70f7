"""`train`'s "left out" line after `push` sent the folder (real sshd, real push and sync): said as pushed and
unchanged, then as changed since, never "To send data/: gpu-train push data" again. The words are
tests/unit/test_project_rules.py's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import Lab, project_id
from tests.gcs import Emulator

LAB_ADDRESS = "127.0.47.3"
BUCKET_LAB_ADDRESS = "127.0.47.4"


def a_project(lab: Lab) -> None:
    """A git work tree whose gitignored data/ the sync leaves out (1 MiB)."""
    subprocess.run(["git", "init", "-q", str(lab.cwd)], check=True)
    (lab.cwd / ".gitignore").write_text("data/\n")
    (lab.cwd / "train.py").write_text("print('hi')\n")
    (lab.cwd / "data").mkdir()
    (lab.cwd / "data" / "train.csv").write_bytes(b"x" * (1 << 20))


def left_out(lab: Lab) -> str:
    """A `train`'s "left out" line ("" when it says none)."""
    out = lab.fab("train", "--command", "true", check=True)
    lab.wait(out.stdout.split()[1])
    return next((line for line in out.stderr.splitlines() if "left out" in line), "")


def test_train_says_a_pushed_folder_was_pushed_and_when_it_changed(lab: Lab) -> None:
    a_project(lab)
    first = left_out(lab)
    assert "left out: data/ 1.0 MiB, ignored by .gitignore" in first and "To send data/: " in first, first
    lab.fab("push", "data", check=True)
    pushed = left_out(lab)
    assert "data/ was pushed to " in pushed and "and is unchanged since: the job finds it in $DATA_DIR/data" in pushed, pushed
    assert "To send" not in pushed
    assert left_out(lab) == ""  # said once, as before
    (lab.cwd / "data" / "val.csv").write_bytes(b"y" * (1 << 19))
    changed = left_out(lab)
    assert "data/ changed since it was pushed to " in changed and "(1 file(s), 1.0 MiB then; 2, 1.5 MiB now)" in changed, changed
    assert "push data` sends the changes" in changed
    lab.fab("push", "data", check=True)
    assert "and is unchanged since" in left_out(lab)


@pytest.fixture
def bucket_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A Lab whose stack has a gpu-train:bucket, on the GCS emulator (tests/e2e/test_bucket_e2e.py's)."""
    emu = Emulator("ckpt", tmp_path / "emulator.log")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.url)
    lab = Lab(tmp_path, BUCKET_LAB_ADDRESS, setenv=f"STORAGE_EMULATOR_HOST={emu.url}")
    stack = lab.stacks / "Pulumi.lab.yaml"
    stack.write_text(stack.read_text() + "  gpu-train:bucket: gs://ckpt/team\n")
    yield lab
    lab.sshd.stop()
    emu.stop()


def test_train_says_a_folder_pushed_to_the_bucket_was_pushed(bucket_lab: Lab) -> None:
    lab = bucket_lab
    a_project(lab)
    lab.fab("push", "data", "--to", "bucket", check=True)
    where = f"gs://ckpt/team/.gpu-train-data/{project_id(lab.home, lab.cwd)}/data/"
    pushed = left_out(lab)
    assert f"data/ was pushed to {where} and is unchanged since: the job finds it in $DATA_DIR/data" in pushed, pushed
    (lab.cwd / "data" / "train.csv").write_bytes(b"x" * 10)
    changed = left_out(lab)
    assert f"data/ changed since it was pushed to {where} (1 file(s) differ by name or size): " in changed, changed
