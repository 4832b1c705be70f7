"""The parallel fetch against a real sshd: identical trees, incremental, resumable, never clobbering."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest

from agent import fetchserve
from gpu_train import fetchwire
from remote.transfer.fetch import generator as fp
from remote.transfer.fetch import receiver as fl
from remote.transfer.fetch.stream import Stream


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "a/../../b", "a//b", "", "./a", "a/."])
def test_local_paths_from_the_host_are_checked(rel: str) -> None:
    with pytest.raises(fl.UnsafePath):
        fl.check_rel(rel)


def test_planning_sees_a_tree_as_lstat_does_and_skips_only_folders_it_made(tmp_path: Path) -> None:
    """Planning skips the lstat only in folders this fetch made (empty when made); everywhere else it
    must see the very same things as lstat, links and files where the host has folders included."""
    base = tmp_path / "d"
    (base / "real" / "deep").mkdir(parents=True)
    (base / "real" / "f").write_text("x")
    (base / "real" / "deep" / "g").write_text("yy")
    (base / "file").write_text("z")
    (base / "link").symlink_to("real")
    (base / "real" / "l").symlink_to("f")
    rels = [
        "real/f",
        "real/deep/g",
        "real/l",
        "real/missing",
        "missing/x",
        "file/x",
        "link/f",
        "link",
        "file",
        "real",
        "real/deep/missing/y",
        "link/deep/g",
    ]
    planned = fl.Tree(base)
    assert [planned.planned(r) for r in rels] == [fl.Tree(base).state(r) for r in rels]
    assert [planned.planned(r).kind for r in ("file/x", "link/f", "link/deep/g")] == ["o", "o", "o"]  # type: ignore[union-attr]  # (each exists)
    fresh = fl.Tree(tmp_path / "nowhere")
    fresh.folder("a")
    assert fresh.made == {"", "a"} and fresh.planned("a/b") is None and fresh.planned("c") is None
    planned.folder("real/new")
    assert planned.made == {"real/new"}  # the others were there already
    with pytest.raises(fl.UnsafePath):
        fresh.planned("a/../../x")


def test_never_written_through_a_link_or_a_file_on_the_way(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    outside = tmp_path / "outside"
    outside.mkdir()
    dest.mkdir()
    (dest / "via").symlink_to(outside)
    (dest / "file").write_text("x")
    assert fl.local_state(dest, "via/evil") == fp.Local("o")
    assert fl.local_state(dest, "file/evil") == fp.Local("o")
    with pytest.raises(fl.UnsafePath):
        fl.ensure_dir(dest, "via/sub")
    assert list(outside.iterdir()) == []


def test_ranges_are_read_by_pattern_and_anything_else_as_the_json_it_is(tmp_path: Path) -> None:
    """The laptop reads the host's usual range header and trailer by pattern (no JSON parser per file);
    the host's real output must match it, and a short read or an error still reads as JSON."""
    job = tmp_path / "root" / "runs" / "r_1" / "job"
    job.mkdir(parents=True)
    (job / "a.bin").write_bytes(os.urandom(1000))
    wire, buf = io.BytesIO(), memoryview(bytearray(fetchserve.CHUNK))
    for item in (["r_1", "a.bin", 0, 1000], ["r_1", "a.bin", 600, 900], ["r_1", "gone.bin", 0, 1]):
        fetchserve.send_range(str(tmp_path / "root"), item, wire, {}, buf)
    head, rest = wire.getvalue().split(b"\n", 1)
    assert fetchwire.RANGE_HEAD_RE.fullmatch(head + b"\n")
    assert fetchwire.RANGE_TRAILER_RE.fullmatch(rest[1000:].split(b"\n", 1)[0] + b"\n")
    (tmp_path / "wire").write_bytes(wire.getvalue())
    stream = Stream(["cat", str(tmp_path / "wire")])
    got = []
    try:
        for n in (1000, 900, 1):
            data = bytearray()
            got.append((*stream.read_range(lambda v, data=data: data.extend(v), buf, n), bytes(data)))
    finally:
        stream.close()
    (whole, n1, d1), (short, n2, d2), (error, n3, _) = got
    sha = hashlib.sha256
    assert (n1, d1, whole["sha256"]) == (1000, (job / "a.bin").read_bytes(), sha(d1).hexdigest())
    assert whole["stat"][0] == 1000 and len(whole) == 2  # sha256 and stat, nothing more
    assert (n2, d2[:400], d2[400:]) == (900, (job / "a.bin").read_bytes()[600:], bytes(500))
    assert short["short"] == 500 and short["sha256"] == sha(d2).hexdigest()  # read as JSON
    assert n3 == 0 and "error" in error
