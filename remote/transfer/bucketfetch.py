"""A run home from its bucket (gpu-train:bucket): `fetch --from bucket`, and `fetch` when the host is gone.

Google's own client (google-cloud-storage), which honours STORAGE_EMULATOR_HOST. The same guarantees
as the host's fetch: incremental (a local file whose size and CRC32C equal the object's is left
alone), verified (the CRC32C of the bytes received must be the object's, as Cloud Storage reports
it), never a partial file in place (each object is written in the destination's partial folder and
renamed into place, with the receiver's checks against anything that changed or leads outside),
and parallel (several objects at once).
"""

from __future__ import annotations

import io
import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from gpu_train.checksum import crc32c_of
from gpu_train.contract import RUN_FILES, RUN_LOG, WORKDIR, is_run_id
from gpu_train.stack.bucket import AREA_RE, RUNS_FOLDER, BucketPlace, run_prefix, stack_prefix
from remote.errors import RemoteError
from remote.transfer.fetch.generator import CONFLICT, KEEP_NEWER, PREVIOUS, Entry, decide, reserved
from remote.transfer.fetch.receiver import Tree, UnsafePath, check_rel, part_path, partial_dir

if TYPE_CHECKING:
    from google.cloud import storage

    from remote.transfer.fetch.generator import Local

RUN_TIME = re.compile(r"_(\d{8}_\d{6})$")
TIMEOUT = (30, 120)  # seconds to connect, and to wait for each read: a stream that stops answering ends
NODE_DIR = re.compile(r"node-[1-9]\d*/")  # node N's files inside a run's folder (gpu_train.stack.bucket.run_prefix)


def client(project: str | None = None) -> storage.Client:
    """Google's client, with Application Default Credentials (or the emulator STORAGE_EMULATOR_HOST names)."""
    try:
        from google.cloud import storage
    except ImportError as e:
        raise RemoteError(f"fetching from a bucket needs google-cloud-storage ({e}): pip install -r requirements.txt") from None
    return storage.Client(project=project)


def run_order(run: str) -> tuple[str, str]:
    """A run id's place among others: by the time in it, then by name."""
    return (m.group(1) if (m := RUN_TIME.search(run)) else "", run)


def runs_in(gcs: storage.Client, place: BucketPlace, area: str) -> tuple[list[str], list[str]]:
    """The runs in one stack's area of the bucket (gpu_train.stack.bucket.area_of), oldest first (by the time
    in their ids), and the names there that are not run ids (``.``, ``..``, a decoy): never fetched, never
    "the newest" (each is said)."""
    folder = stack_prefix(place, area)
    pages = gcs.list_blobs(place.name, prefix=folder, delimiter="/")
    for _ in pages:  # the prefixes are filled in as the pages are read
        pass
    names = [p[len(folder) :].rstrip("/") for p in pages.prefixes]
    runs = [n for n in names if is_run_id(n) and RUN_TIME.search(n)]
    return sorted(runs, key=run_order), sorted(set(names) - set(runs))


def areas_named(gcs: storage.Client, place: BucketPlace, stack: str) -> list[str]:
    """The areas in the bucket of a stack named ``stack`` (``STACK@XXXXXXXX``): this stack's, another person's,
    or this one's from a stack file that lost its ``bucketArea``."""
    folder = f"{place.prefix}{RUNS_FOLDER}"
    pages = gcs.list_blobs(place.name, prefix=f"{folder}{stack}@", delimiter="/")
    for _ in pages:
        pass
    return sorted(n for p in pages.prefixes if AREA_RE.fullmatch(n := p[len(folder) :].rstrip("/")))


# A run's folder in the bucket is the laptop's runs/STACK/RUN/: JOB_DIR's files, the working directory's
# outputs under workdir/, the run's log as .gpu-train/log, node N's under node-N/. Any other name the
# run's folder here keeps for itself (.previous/, .gpu-train/ but its log, a partial folder) is refused.
ALLOWED_RESERVED = re.compile(rf"{WORKDIR}/.+|{re.escape(RUN_FILES)}/{RUN_LOG}|node-[1-9]\d*/.+")


def object_problem(rel: str) -> str | None:
    """Why an object's path inside a run cannot be written here, or None."""
    try:
        check_rel(rel)
    except UnsafePath as e:
        return str(e)
    if reserved(rel) and not ALLOWED_RESERVED.fullmatch(rel):
        return f"{rel}: a name the run's folder here keeps for itself: not written"
    return None


def updated_ns(blob: storage.Blob) -> int:
    """When the object was written (its upload: at or after the host file's last change), in ns."""
    when = getattr(blob, "updated", None)
    return int(when.timestamp() * 1e9) if when is not None else 0


@dataclass
class Fetched:
    files: int = 0
    bytes: int = 0
    unchanged: int = 0
    problems: list[str] = field(default_factory=list)
    kept_newer: list[str] = field(default_factory=list)  # the laptop's copy changed after the upload: kept
    kept: list[str] = field(default_factory=list)  # replaced, the previous content kept in .previous/


class Bounded(io.RawIOBase):
    """A file that takes at most ``limit`` bytes: a download longer than the object it was listed as
    stops at the first byte over, before it is written."""

    def __init__(self, f: IO[bytes], limit: int):
        self.f, self.limit, self.got = f, limit, 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:  # (a bytes-like object)
        self.got += len(b)
        if self.got > self.limit:
            raise OSError(f"more bytes than the {self.limit} the bucket listed")
        return self.f.write(b)


def fetch_run(
    gcs: storage.Client,
    place: BucketPlace,
    area: str,
    run: str,
    dest: Path,
    streams: int = 8,
    say: Callable[[str], None] = print,
    node: int | None = None,
) -> Fetched:
    """Bring gs://NAME/PREFIX/.gpu-train-runs/AREA/RUN/ into ``dest`` by the host fetch's own rules (generator.decide):
    a local copy with the object's size and CRC32C stays; one changed here after the upload is kept (local
    newer); one replaced keeps its previous content in RUN/.previous/; reserved names and paths that lead
    out are refused; every object's size is summed against the free space before anything is written; each
    download is raw (no gzip inflation), at the generation listed, bounded by its listed size, under a
    deadline per read, then verified. ``node``: that node's files only (node 0's: all but the node-N/
    folders; node N's: RUN/node-N/)."""
    if not is_run_id(run):
        raise RemoteError(f"{run[:80]!r} is not a run id: not fetched")
    prefix = run_prefix(place, area, run, node or 0)
    blobs = [
        b
        for b in gcs.list_blobs(place.name, prefix=prefix, timeout=TIMEOUT)
        if not b.name.endswith("/") and not (node == 0 and NODE_DIR.match(b.name[len(prefix) :]))
    ]
    if not blobs:
        raise RemoteError(f"nothing in {place.url(prefix[len(place.prefix) :])}: no such run in the bucket")
    tree, out = Tree(dest), Fetched()
    keep = Tree(dest / PREVIOUS)
    todo = []
    for blob in blobs:
        rel = blob.name[len(prefix) :]
        if (why := object_problem(rel)) is not None:
            out.problems.append(why)
            continue
        try:
            here = tree.state(rel)
        except UnsafePath as e:
            out.problems.append(str(e))
            continue
        if here is not None and here.kind == "f" and here.size == blob.size and crc32c_of(f"{dest}/{rel}") == blob.crc32c:
            out.unchanged += 1
            continue
        action = decide(Entry(rel, "f", int(blob.size), updated_ns(blob)), here)
        if action == KEEP_NEWER:
            out.kept_newer.append(rel)
        elif action == CONFLICT:
            out.problems.append(f"{dest}/{rel}: something else is in the way (not a file); left alone")
        else:
            todo.append((blob, rel, here))
    need = sum(int(b.size) for b, _, _ in todo)
    free = shutil.disk_usage(next(p for p in (dest, *dest.parents) if p.exists())).free
    if need > free:
        out.problems.append(f"the bucket holds {need} bytes to fetch, more than this disk has free ({free} bytes): nothing was fetched")
        return out

    for _, rel, _ in todo:  # the folders first, here (the receiver's Tree checks each), then the files in parallel
        tree.folder(rel.rpartition("/")[0])

    def one(item: tuple[storage.Blob, str, Local | None]) -> str | None:
        blob, rel, planned = item
        part = part_path(dest, rel)
        os.makedirs(os.path.dirname(part), exist_ok=True)
        try:
            # The generation listed, so an object replaced meanwhile is not mixed into this one.
            with open(part, "wb") as f:
                blob.download_to_file(
                    Bounded(f, int(blob.size)), if_generation_match=blob.generation, raw_download=True, checksum="crc32c", timeout=TIMEOUT
                )
            got = crc32c_of(part)
            if got != blob.crc32c or os.path.getsize(part) != blob.size:
                return (
                    f"{rel}: received {os.path.getsize(part)} bytes with crc32c {got}; the bucket has "
                    f"{blob.size} bytes with crc32c {blob.crc32c}; not installed"
                )
            os.utime(part, ns=(updated_ns(blob), updated_ns(blob)))
            if not tree.install(part, rel, planned, keep if planned is not None else None):
                return f"{dest}/{rel} changed during the fetch; the bucket's copy was not put in its place"
        except Exception as e:  # the network, a permission, an object gone: said, the rest goes on
            return f"{rel}: {e}"
        finally:
            if os.path.exists(part):
                os.unlink(part)
        if planned is not None:
            out.kept.append(rel)
        out.files += 1
        out.bytes += int(blob.size)
        return None

    with ThreadPoolExecutor(max(1, streams)) as pool:
        out.problems += [p for p in pool.map(one, todo) if p]
    folder = partial_dir(dest)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
    if out.kept_newer:
        say(
            f"kept the laptop's copy, changed here after the bucket's: {', '.join(out.kept_newer[:5])}"
            + (" ..." if len(out.kept_newer) > 5 else "")
        )
    if out.kept:
        say(f"replaced {len(out.kept)} file(s); their previous content is in {dest / PREVIOUS}")
    return out
