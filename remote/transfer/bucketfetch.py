"""A run home from its bucket (gpu-train:bucket): `fetch --from bucket`, and `fetch` when the host is gone.

Google's own client (google-cloud-storage), which honours STORAGE_EMULATOR_HOST. The same guarantees
as the host's fetch: incremental (a local file whose size and CRC32C equal the object's is left
alone), verified (the CRC32C of the bytes received must be the object's, as Cloud Storage reports
it), never a partial file in place (each object is written in the destination's partial folder and
renamed into place, with the receiver's checks against anything that changed or leads outside),
and parallel (several objects at once).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpu_train.checksum import crc32c_of
from gpu_train.stack.bucket import BucketPlace, run_prefix
from remote.errors import RemoteError
from remote.transfer.fetch.receiver import Tree, UnsafePath, part_path, partial_dir

RUN_TIME = re.compile(r"_(\d{8}_\d{6})$")
NODE_DIR = re.compile(r"node-[1-9]\d*/")  # node N's files inside a run's folder (gpu_train.stack.bucket.run_prefix)


@dataclass
class Fetched:
    files: int = 0
    bytes: int = 0
    unchanged: int = 0
    problems: list[str] = field(default_factory=list)


def client(project: str | None = None):
    """Google's client, with Application Default Credentials (or the emulator STORAGE_EMULATOR_HOST names)."""
    try:
        from google.cloud import storage
    except ImportError as e:
        raise RemoteError(f"fetching from a bucket needs google-cloud-storage ({e}): pip install -r requirements.txt") from None
    return storage.Client(project=project)


def runs_in(gcs, place: BucketPlace, stack: str) -> list[str]:
    """The stack's runs in the bucket, oldest first (by the time in their ids)."""
    pages = gcs.list_blobs(place.name, prefix=f"{place.prefix}{stack}/", delimiter="/")
    for _ in pages:  # the prefixes are filled in as the pages are read
        pass
    names = [p[len(place.prefix) + len(stack) + 1 :].rstrip("/") for p in pages.prefixes]
    return sorted(names, key=lambda r: (m.group(1) if (m := RUN_TIME.search(r)) else "", r))


def fetch_run(
    gcs, place: BucketPlace, stack: str, run: str, dest: Path, streams: int = 8, say: Callable[[str], None] = print, node: int | None = None
) -> Fetched:
    """Bring gs://NAME/PREFIX/STACK/RUN/ into ``dest``: each object whose local copy differs, verified.
    ``node``: that node's files only (node 0's: all but the node-N/ folders; node N's: RUN/node-N/)."""
    prefix = run_prefix(place, stack, run, node or 0)
    blobs = [
        b
        for b in gcs.list_blobs(place.name, prefix=prefix)
        if not b.name.endswith("/") and not (node == 0 and NODE_DIR.match(b.name[len(prefix) :]))
    ]
    if not blobs:
        raise RemoteError(f"nothing in {place.url(prefix[len(place.prefix) :])}: no such run in the bucket")
    tree, out = Tree(dest), Fetched()
    todo = []
    for blob in blobs:
        rel = blob.name[len(prefix) :]
        try:
            here = tree.state(rel)
        except UnsafePath as e:
            out.problems.append(str(e))
            continue
        if here is not None and here.kind == "f" and here.size == blob.size and crc32c_of(f"{dest}/{rel}") == blob.crc32c:
            out.unchanged += 1
            continue
        if here is not None and here.kind != "f":
            out.problems.append(f"{dest}/{rel}: something else is in the way (not a file); left alone")
            continue
        todo.append((blob, rel, here))

    for _, rel, _ in todo:  # the folders first, here (the receiver's Tree checks each), then the files in parallel
        tree.folder(rel.rpartition("/")[0])

    def one(item) -> str | None:
        blob, rel, planned = item
        part = part_path(dest, rel)
        os.makedirs(os.path.dirname(part), exist_ok=True)
        try:
            # The generation listed, so an object replaced meanwhile is not mixed into this one.
            blob.download_to_filename(part, if_generation_match=blob.generation, checksum="crc32c")
            got = crc32c_of(part)
            if got != blob.crc32c or os.path.getsize(part) != blob.size:
                return (
                    f"{rel}: received {os.path.getsize(part)} bytes with crc32c {got}; the bucket has "
                    f"{blob.size} bytes with crc32c {blob.crc32c}; not installed"
                )
            if not tree.install(part, rel, planned):
                return f"{dest}/{rel} changed during the fetch; the bucket's copy was not put in its place"
        except Exception as e:  # the network, a permission, an object gone: said, the rest goes on
            return f"{rel}: {e}"
        finally:
            if os.path.exists(part):
                os.unlink(part)
        out.files += 1
        out.bytes += int(blob.size)
        return None

    with ThreadPoolExecutor(max(1, streams)) as pool:
        out.problems += [p for p in pool.map(one, todo) if p]
    folder = partial_dir(dest)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
    return out
