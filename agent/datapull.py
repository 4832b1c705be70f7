"""`gpu-train-agent bucket-data RUN`: what `push --to bucket` sent, to $DATA_DIR, exactly as the laptop's
manifest names it.

The bucket is a shared room: any VM with the grant, any person with access can write objects under
the data prefix. So nothing is taken from a listing: the spec carries the laptop's manifest
(bucketdoc.DataManifest: each file's object generation, size and SHA-256, written at `push`), and
only those generations of those names come down, each verified by size and SHA-256 before it is
renamed into place. No manifest, no pull. Run by the job's Python (Google's client, imported here only).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import threading
from typing import Any, cast

from gpu_train.bucketdoc import DataFile, DataManifest
from gpu_train.ownership import project_dirs

from .store import AgentError, read_json, read_spec, write_json

DATA_WORKERS = 8  # as the transfer manager's default threads, and what bench/bucketdata.py measured
COPIED, SAME = "copied", "same"
BLOCK = 1 << 20
TIMEOUT = (30, 120)  # seconds to connect, and to wait for each read: a stalled download fails the run, never hangs it


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def safe_parts(rel: str) -> list[str] | None:
    """``rel``'s parts, or None when it is not a plain relative path (empty, '.', '..', absolute)."""
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") or "\0" in p for p in parts):
        return None
    return parts


def plan(manifests: list[DataManifest], prefix: str, data_dir: str) -> list[tuple[str, str, str, DataFile]]:
    """(path shown, object name, local path, what it must be) for each file of each manifest; AgentError
    for a path that is not plain (the spec is the laptop's, but it is checked where it arrives)."""
    out = []
    for m in manifests:
        folder = safe_parts(m["folder"])
        if folder is None:
            raise AgentError(f"the data manifest's folder {m['folder']!r} is not a plain relative path")
        for rel, want in sorted(m["files"].items()):
            parts = safe_parts(rel)
            if parts is None:
                raise AgentError(f"the data manifest's {m['folder']}/{rel!r} is not a plain relative path")
            shown = f"{m['folder']}/{rel}"
            out.append((shown, f"{prefix}{shown}", os.path.join(data_dir, *folder, *parts), want))
    return out


def identity(st: os.stat_result) -> list[int]:
    """What changes whenever a file's bytes may have: ctime too, which no one can set back (os.utime cannot)."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class Verified:
    """The SHA-256 of local copies already verified, by their identity (REMOTE_ROOT/data/.PROJECT.verified.json,
    beside DATA_DIR, never in it): an unchanged copy is not read again at each start (SHA-256 ran at 334 MB/s
    here, CRC32C at 1.9 GB/s), and a copy changed in any way (its mtime put back too) is hashed again."""

    def __init__(self, data_dir: str):
        parent, name = os.path.split(data_dir.rstrip("/"))
        self.path = os.path.join(parent, f".{name}.verified.json")
        doc = read_json(self.path)
        self.known: dict[str, list[Any]] = doc if isinstance(doc, dict) else {}  # path -> [size, mtimeNs, ino, ctimeNs, sha256]

    def matches(self, path: str, want: DataFile) -> bool:
        """The local copy is a regular file (not a link) with the manifest's size and SHA-256."""
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != want["size"]:
            return False
        seen = self.known.get(path)
        if seen is not None and seen[:4] == identity(st):
            return bool(seen[4] == want["sha256"])
        digest = sha256_of(path)
        self.known[path] = [*identity(st), digest]
        return digest == want["sha256"]

    def installed(self, path: str, digest: str) -> None:
        with contextlib.suppress(OSError):
            self.known[path] = [*identity(os.lstat(path)), digest]

    def save(self) -> None:
        with contextlib.suppress(OSError):
            write_json(self.path, self.known)


def pull_data(root: str, run_id: str) -> int:
    """Each file of the spec's manifests whose local copy differs (size, SHA-256) downloaded at its recorded
    generation to a temporary name beside it, verified, then renamed; DATA_WORKERS at a time (many small
    files: one by one was x5 slower at a 20 ms round trip, docs/bucket.md). Exit 1 naming each failure."""
    run_dir = os.path.join(root, "runs", run_id)
    spec = read_spec(run_dir)
    where, data_dir = spec.bucket or {}, project_dirs(root, spec.project)[1]
    if not spec.bucket_data or not where.get("data"):
        print("[gpu-train data] no data manifest in the spec: nothing is taken from the bucket", flush=True)
        return 0
    verified = Verified(data_dir)
    todo = [t for t in plan([cast(DataManifest, m) for m in spec.bucket_data], where["data"], data_dir) if not verified.matches(t[2], t[3])]
    need = sum(int(t[3]["size"]) for t in todo)
    os.makedirs(data_dir, exist_ok=True)
    free = shutil.disk_usage(data_dir).free
    if need > free:
        verified.save()
        print(f"[gpu-train data] {need} bytes to copy and {free} free in {data_dir}: nothing copied", flush=True)
        return 1
    from concurrent.futures import ThreadPoolExecutor

    from google.cloud import storage

    bucket = storage.Client().bucket(where["name"])
    with ThreadPoolExecutor(max_workers=DATA_WORKERS) as pool:
        outcomes = list(pool.map(lambda t: pull_one(bucket, *t), todo))
    for i, t in enumerate(todo):  # (Python 3.8: no zip(strict=))
        if outcomes[i] == COPIED:
            verified.installed(t[2], t[3]["sha256"])
    verified.save()
    bad = [why for why in outcomes if why != COPIED]
    for why in bad:
        print(f"[gpu-train data] {why}", flush=True)
    print(f"[gpu-train data] {outcomes.count(COPIED)} file(s) copied from gs://{where['name']}/{where['data']} to {data_dir}", flush=True)
    return 1 if bad else 0


def pull_one(bucket: Any, shown: str, name: str, path: str, want: DataFile) -> str:
    """One file into place at the manifest's generation: COPIED once its size and SHA-256 are the manifest's
    and it is renamed, else why not (the local file untouched). The raw bytes (no gzip inflation: a
    planted Content-Encoding cannot make the host write more than the manifest's size before the check)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.gpu-train-part.{os.getpid()}.{threading.get_ident()}"
    try:
        blob = bucket.blob(name, generation=int(want["generation"]))
        blob.download_to_filename(tmp, raw_download=True, checksum=None, timeout=TIMEOUT)
        size, digest = os.path.getsize(tmp), sha256_of(tmp)
        if size != want["size"] or digest != want["sha256"]:
            return (
                f"{shown}: the bucket's generation {want['generation']} is {size} bytes with SHA-256 {digest[:16]}..., not "
                f"the {want['size']} bytes `push` sent: not installed (`push --to bucket` again)"
            )
        os.replace(tmp, path)
        return COPIED
    except Exception as e:  # one file's failure is named with the others'; the run does not start
        return f"{shown}: {type(e).__name__}: {e}"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
