"""`push DIR --to bucket`: a folder to gs://NAME/PREFIX/.gpu-train-data/PROJECT/DIR/, and its manifest.

The bucket is shared with every VM that has the grant, so what a run copies from it is not what a
listing shows but what the laptop sent: each push writes a manifest (bucketdoc.DataManifest: each
file's object generation, size and SHA-256 of the bytes sent) into the user's own records
(Environment.user_home, never the project's tree), and `train` carries the manifests in the spec.
A file counts as unchanged only when the manifest already names it with the same SHA-256 and the
bucket still holds that generation with that size: a CRC32C (which a writer who chooses the bytes
can match) is never taken as proof that the object holds the user's bytes.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, cast

from gpu_train.atomic import atomic_write
from gpu_train.bucketdoc import DataFile, DataManifest
from gpu_train.checksum import crc32c_of
from gpu_train.stack.bucket import BucketPlace
from remote.transfer.bucketfetch import Fetched

if TYPE_CHECKING:
    from google.cloud import storage

BLOCK = 1 << 20


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def store_path(home: Path, place: BucketPlace, data_prefix: str) -> Path:
    """The user's record of what was pushed under ``data_prefix`` of ``place``'s bucket (one file per bucket
    and project: the manifests of each folder pushed there)."""
    key = hashlib.sha256(f"{place.name}/{data_prefix}".encode()).hexdigest()[:24]
    return home / "bucket-data" / place.name / f"{key}.json"


def load(home: Path, place: BucketPlace, data_prefix: str) -> dict[str, DataManifest]:
    """The folders pushed there, each with its manifest; {} when none (then a run copies nothing)."""
    try:
        doc = json.loads(store_path(home, place, data_prefix).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("bucket") != place.name or doc.get("prefix") != data_prefix:
        return {}
    folders = doc.get("folders")
    if not isinstance(folders, dict):
        return {}
    return {k: cast(DataManifest, v) for k, v in folders.items() if isinstance(v, dict) and v.get("folder") == k}


def save(home: Path, place: BucketPlace, data_prefix: str, manifest: DataManifest) -> None:
    folders = {**load(home, place, data_prefix), manifest["folder"]: manifest}
    doc = {"bucket": place.name, "prefix": data_prefix, "folders": folders}
    atomic_write(store_path(home, place, data_prefix), json.dumps(doc, indent=1, sort_keys=True) + "\n", mode=0o600)


def push_folder(
    gcs: storage.Client, place: BucketPlace, data_prefix: str, folder: str, src: Path, known: DataManifest | None, streams: int = 8
) -> tuple[Fetched, DataManifest]:
    """``src``'s files to gs://NAME/DATA_PREFIX/FOLDER/: what the manifest ``known`` does not hold as it is
    now (same SHA-256, and that generation still in the bucket with that size), each one upload
    (visible only once complete) checked against its CRC32C in transit. The new manifest: only files whose
    upload was verified (a failed one is left out, so no run ever asks for it)."""
    prefix = f"{data_prefix}{folder}/"
    bucket = gcs.bucket(place.name)
    there = {b.name: (int(b.generation), int(b.size)) for b in gcs.list_blobs(place.name, prefix=prefix)}
    before: dict[str, DataFile] = known["files"] if known else {}
    out, files, todo = Fetched(), {}, []
    for path in sorted(p for p in src.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(src).as_posix()
        size, digest = path.stat().st_size, sha256_of(path)
        had = before.get(rel)
        if had and had["sha256"] == digest and had["size"] == size and there.get(prefix + rel) == (had["generation"], size):
            files[rel] = had
            out.unchanged += 1
        else:
            todo.append((path, rel, size, digest))

    def one(item: tuple[Path, str, int, str]) -> tuple[str, DataFile | str]:
        path, rel, size, digest = item
        crc, mtime = crc32c_of(str(path)), path.stat().st_mtime_ns
        blob = bucket.blob(prefix + rel)
        try:
            blob.upload_from_filename(str(path), checksum="crc32c")
        except Exception as e:  # the network, a permission: said, the rest goes on
            return rel, f"{path}: {e}"
        if blob.crc32c != crc or path.stat().st_mtime_ns != mtime or path.stat().st_size != size or blob.generation is None:
            return rel, f"{path}: changed while it was sent (the bucket's crc32c {blob.crc32c}, the file's {crc}): push again"
        return rel, DataFile(generation=int(blob.generation), size=size, sha256=digest)

    with ThreadPoolExecutor(max(1, streams)) as pool:
        for rel, got in pool.map(one, todo):
            if isinstance(got, str):
                out.problems.append(got)
            else:
                files[rel] = got
                out.files += 1
                out.bytes += got["size"]
    return out, DataManifest(folder=folder, files=dict(sorted(files.items())))
