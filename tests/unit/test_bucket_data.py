"""The project's data through the bucket: `push --to bucket`'s manifest (laptop) and the host's copy of
exactly what it names (`bucket-data`), against a real storage emulator and the real agent."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import google_crc32c
from google.cloud import storage

from agent.datalink import link_data
from gpu_train.stack.bucket import BucketPlace, data_prefix, parse_bucket, parts_prefix, run_prefix
from remote.transfer import datapush
from tests.conftest import ROOT
from tests.gcs import Emulator

RUN = "job_20260101_000000"
PLACE = BucketPlace("ckpt", "p/")
PREFIX = data_prefix(PLACE, "proj")


def pull(tmp_path: Path, manifests: list[dict]) -> subprocess.CompletedProcess:
    d = tmp_path / "root" / "runs" / RUN
    d.mkdir(parents=True, exist_ok=True)
    bucket = {"name": "ckpt", "prefix": f"p/lab/{RUN}/", "data": PREFIX}
    spec = {"runId": RUN, "base": "job", "project": "proj", "bucket": bucket, "bucketData": manifests}
    (d / "spec.json").write_text(json.dumps(spec))
    argv = [sys.executable, "-m", "agent", "--root", str(tmp_path / "root"), "bucket-data", RUN]
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def push(src: Path, home: Path, folder: str = "data") -> tuple[datapush.Fetched, dict]:
    got, manifest = datapush.push_folder(storage.Client(), PLACE, PREFIX, folder, src, datapush.load(home, PLACE, PREFIX).get(folder))
    datapush.save(home, PLACE, PREFIX, manifest)
    return got, dict(manifest)


def tree(top: Path) -> dict[str, bytes]:
    return {p.relative_to(top).as_posix(): p.read_bytes() for p in top.rglob("*") if p.is_file()}


def test_only_what_the_laptop_pushed_comes_down_and_a_planted_object_never(tmp_path: Path, gcs: Emulator) -> None:
    """Anything that can write the bucket (another stack's VM) planted numpy.py beside the data: it came
    down and was linked into the working directory, ahead of the real numpy."""
    src = tmp_path / "data"
    (src / "shard").mkdir(parents=True)
    want = {f"shard/{i:03d}.bin": os.urandom(1000 + i) for i in range(40)}
    want["meta.json"] = b'{"v": 2}'
    for rel, data in want.items():
        (src / rel).write_bytes(data)
    got, manifest = push(src, tmp_path / "home")
    assert (got.files, got.unchanged, got.problems) == (41, 0, [])
    bucket = storage.Client().bucket("ckpt")
    bucket.blob(PREFIX + "numpy.py").upload_from_string(b"import os; os.system('touch /tmp/pwned')")
    bucket.blob(PREFIX + "data/planted.txt").upload_from_string(b"not the user's")
    data_dir = tmp_path / "root" / "data" / "proj"
    (data_dir / "data" / "shard").mkdir(parents=True)
    (data_dir / "data" / "meta.json").write_bytes(b'{"v": 1}')  # other bytes: replaced
    same = data_dir / "data" / "shard" / "000.bin"
    same.write_bytes(want["shard/000.bin"])  # the same bytes: left as it is
    inode = same.stat().st_ino

    r = pull(tmp_path, [manifest])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "40 file(s) copied" in r.stdout
    assert tree(data_dir) == {f"data/{k}": v for k, v in want.items()}  # no numpy.py, no planted.txt
    assert same.stat().st_ino == inode

    assert pull(tmp_path, []).returncode == 0  # no manifest, no pull
    assert "nothing is taken from the bucket" in pull(tmp_path, []).stdout


def test_an_object_replaced_after_the_push_is_refused_and_the_local_copy_kept(tmp_path: Path, gcs: Emulator) -> None:
    src = tmp_path / "data"
    src.mkdir()
    (src / "a.bin").write_bytes(b"the user's bytes")
    (src / "b.bin").write_bytes(b"b")
    _, manifest = push(src, tmp_path / "home")
    storage.Client().bucket("ckpt").blob(PREFIX + "data/a.bin").upload_from_string(b"an attacker's bytes")
    r = pull(tmp_path, [manifest])
    assert r.returncode == 1
    assert "data/a.bin: " in r.stdout and "not installed" in r.stdout, r.stdout
    data_dir = tmp_path / "root" / "data" / "proj"
    assert not (data_dir / "data" / "a.bin").exists() and (data_dir / "data" / "b.bin").read_bytes() == b"b"
    assert not list(data_dir.rglob("*gpu-train-part*"))
    bad = {**manifest, "files": {"../../escape": {"generation": 1, "size": 1, "sha256": "0" * 64}}}
    r = pull(tmp_path, [bad])
    assert r.returncode != 0 and "not a plain relative path" in r.stdout + r.stderr


def forge(data: bytes, crc: str) -> bytes:
    """``data`` with 4 bytes appended so that its CRC32C is ``crc`` (base64, as Cloud Storage reports it):
    CRC32C is affine in its input's bits, so one solves 32 equations over GF(2)."""
    import base64

    def c(tail: int) -> int:
        return int.from_bytes(google_crc32c.Checksum(data + tail.to_bytes(4, "big")).digest(), "big")

    target, base = int.from_bytes(base64.b64decode(crc), "big"), c(0)
    rows = [(c(1 << i) ^ base, 1 << i) for i in range(32)]  # (effect on the CRC, the tail bit)
    want, tail = target ^ base, 0
    for bit in range(31, -1, -1):  # Gaussian elimination on the effects
        pivot = next((r for r in rows if r[0] >> bit & 1), None)
        if pivot is None:
            continue
        rows.remove(pivot)
        rows = [(e ^ pivot[0], t ^ pivot[1]) if e >> bit & 1 else (e, t) for e, t in rows]
        if want >> bit & 1:
            want, tail = want ^ pivot[0], tail ^ pivot[1]
    assert want == 0
    return data + tail.to_bytes(4, "big")


def test_an_object_with_the_same_size_and_crc32c_is_not_taken_for_the_users(tmp_path: Path, gcs: Emulator) -> None:
    """A writer who chooses the bytes matched the CRC32C: the re-push said "unchanged" and the poison stayed."""
    src = tmp_path / "data"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(4096))
    _, manifest = push(src, tmp_path / "home")
    blob = storage.Client().bucket("ckpt").get_blob(PREFIX + "data/w.bin")
    poison = forge(os.urandom(4092), blob.crc32c)
    assert len(poison) == 4096 and google_crc32c.Checksum(poison).digest() == google_crc32c.Checksum((src / "w.bin").read_bytes()).digest()
    storage.Client().bucket("ckpt").blob(PREFIX + "data/w.bin").upload_from_file(io.BytesIO(poison))
    got, again = push(src, tmp_path / "home")
    assert (got.files, got.unchanged) == (1, 0)  # sent again: the generation it recorded is gone
    assert storage.Client().bucket("ckpt").blob(PREFIX + "data/w.bin").download_as_bytes() == (src / "w.bin").read_bytes()
    assert again["files"]["w.bin"]["generation"] != manifest["files"]["w.bin"]["generation"]
    got, _ = push(src, tmp_path / "home")
    assert (got.files, got.unchanged) == (0, 1)


def test_only_the_pushed_folder_is_linked_into_the_working_directory(tmp_path: Path) -> None:
    data_dir, code = tmp_path / "data", tmp_path / "code"
    (data_dir / "data").mkdir(parents=True)
    (data_dir / "data" / "a.txt").write_text("a")
    (data_dir / "numpy.py").write_text("planted")
    (code / "sub").mkdir(parents=True)
    log = io.BytesIO()
    link_data(str(data_dir), str(code), log, ["data"])
    assert (code / "data").is_symlink() and (code / "data" / "a.txt").read_text() == "a"
    assert not (code / "numpy.py").exists()
    assert b"not linked" in log.getvalue() and b"numpy.py" in log.getvalue()


def test_data_is_under_a_name_no_stack_can_have() -> None:
    """A stack named `data` shared PREFIX/data/ with pushed data: its VM wrote where runs copy from."""
    place = parse_bucket("gs://ckpt/team")
    data = data_prefix(place, "data")
    for stack in ("data", "Data", "gpu-train-data", "x"):
        for run in (RUN, "data"):
            assert not run_prefix(place, stack, run).startswith(data) and not data.startswith(run_prefix(place, stack, run))
            assert not parts_prefix(place, stack, run).startswith(data)
    assert data.startswith("team/.gpu-train-data/")


def test_an_unchanged_copy_is_not_hashed_again_and_a_changed_one_always_is(tmp_path: Path, gcs: Emulator) -> None:
    """SHA-256 of every local copy at every start would read a big dataset whole each time; what was verified
    is remembered by the copy's identity, ctime included, so a copy rewritten in place with its size and
    mtime put back is still found and replaced."""
    src = tmp_path / "data"
    src.mkdir()
    (src / "w.bin").write_bytes(b"A" * 4096)
    _, manifest = push(src, tmp_path / "home")
    assert pull(tmp_path, [manifest]).returncode == 0
    local = tmp_path / "root" / "data" / "proj" / "data" / "w.bin"
    cache = tmp_path / "root" / "data" / ".proj.verified.json"
    assert json.loads(cache.read_text())[str(local)][4] == manifest["files"]["w.bin"]["sha256"]
    r = pull(tmp_path, [manifest])
    assert r.returncode == 0 and "0 file(s) copied" in r.stdout
    was = local.stat()
    with open(local, "r+b") as f:  # the same size, other bytes, the mtime put back
        f.write(b"B")
    os.utime(local, ns=(was.st_atime_ns, was.st_mtime_ns))
    r = pull(tmp_path, [manifest])
    assert r.returncode == 0 and "1 file(s) copied" in r.stdout and local.read_bytes() == b"A" * 4096
