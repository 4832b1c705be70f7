"""A laptop file replaced whole: old or new, never half; its mode kept; a symlinked file written where it points."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_train.atomic import atomic_write


def test_new_file_gets_the_mode_and_no_temporary_is_left(tmp_path: Path) -> None:
    target = tmp_path / "d" / "f.json"
    atomic_write(target, "{}")
    assert target.read_text() == "{}" and target.stat().st_mode & 0o777 == 0o600
    assert os.listdir(target.parent) == ["f.json"]


def test_an_existing_file_keeps_its_mode_and_a_link_is_followed(tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "config"
    real.parent.mkdir()
    real.write_text("old")
    real.chmod(0o644)
    link = tmp_path / "config"
    link.symlink_to(real)
    atomic_write(link, "new")
    assert link.is_symlink() and real.read_text() == "new" and real.stat().st_mode & 0o777 == 0o644


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    target.write_text("old")

    def broken(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, "new")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["f"]
