"""A big file to one object through parts sent in parallel, composed into it: a parallel composite
upload, as ``gcloud storage cp`` makes one.

One upload stream over a long link moves at most its TCP window per round trip; several move
several windows (bench/bucket_parallel.py measures it). Compose and not the XML API's multipart
upload (google-cloud-storage's ``transfer_manager.upload_chunks_concurrently``): Google's own
answer is the same object, but gcp-storage-emulator, which the tests run against, answers 501 to
a multipart upload's first request; compose it serves, so this path is tested for real.

Nothing half-made is ever taken for the file: the parts go to the run's parts prefix (beside the
stacks' runs, never under one, gpu_train/stack/bucket.py), each checked by its CRC32C as it lands;
the object appears at its name only when one compose request makes it whole; the parts are deleted
after it, or, when the uploader was killed, at its next start. The composite object has a CRC32C
and no MD5 (Cloud Storage's docs): the caller checks that CRC32C against the file's.
Standard library here; the bucket passed in is google-cloud-storage's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from google.cloud.storage import Blob, Bucket

PARALLEL_FROM = 64 << 20  # smaller files go as one stream (bench/bucket_parallel.py)
PART_MIN = 32 << 20
MAX_PARTS = 32  # compose takes at most 32 source objects in one request
WORKERS = 8
MAX_OBJECT_NAME = 1024  # bytes, Cloud Storage's limit


def slices(size: int, parallel_from: int = PARALLEL_FROM, part_min: int = PART_MIN, max_parts: int = MAX_PARTS) -> list[tuple[int, int]]:
    """(offset, length) of each part of a file of ``size`` bytes; one part below ``parallel_from``."""
    if size < max(parallel_from, 2 * part_min):
        return [(0, size)]
    count = min(max_parts, size // part_min)
    step = -(-size // count)
    return [(at, min(step, size - at)) for at in range(0, size, step)]


def part_names(parts_prefix: str, rel: str, count: int) -> list[str] | None:
    """The parts' object names for the file ``rel``; None when they would be too long for Cloud
    Storage (the file then goes as one stream)."""
    names = [f"{parts_prefix}{rel}.part-{i:02d}-of-{count:02d}" for i in range(count)]
    return names if len(names[-1].encode()) <= MAX_OBJECT_NAME else None


def forget_parts(bucket: Bucket, parts_prefix: str) -> int:
    """Delete what a killed uploader left under the run's parts prefix; how many objects went."""
    gone = 0
    for blob in bucket.client.list_blobs(bucket.name, prefix=parts_prefix):
        with contextlib.suppress(Exception):  # gone meanwhile, or not ours to delete: not the upload's concern
            blob.delete()
            gone += 1
    return gone


class Slice(io.RawIOBase):
    """``length`` bytes of a file from ``at``, as a file of their own (a resumable upload starts at
    its stream's position 0 and seeks back in it to resend a chunk)."""

    def __init__(self, path: str, at: int, length: int):
        super().__init__()
        self._file = open(path, "rb")  # noqa: SIM115 (closed in close)
        self._at, self._length, self._pos = at, length, 0
        self._file.seek(at)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, min(self._length, base + offset))
        self._file.seek(self._at + self._pos)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        left = self._length - self._pos
        data = self._file.read(left if size is None or size < 0 else min(size, left))
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:  # (a writable buffer: memoryview, bytearray)
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._file.close()
        super().close()


def put_parts(bucket: Bucket, name: str, path: str, pieces: list[tuple[int, int]], names: list[str], workers: int = WORKERS) -> Blob:
    """Upload the file's ``pieces`` to ``names`` in parallel, each verified by its CRC32C as it lands,
    then compose them into ``name``; the parts are deleted either way. Returns the composed blob
    (its crc32c, size and generation as Cloud Storage answered the compose)."""
    parts = [bucket.blob(n) for n in names]

    def send(i: int) -> None:
        with Slice(path, *pieces[i]) as f:
            parts[i].upload_from_file(f, size=pieces[i][1], checksum="crc32c")

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(parts))) as pool:
            for done in pool.map(send, range(len(parts))):  # the first failure raises here
                del done
        final = bucket.blob(name)
        final.compose(parts)
        return final
    finally:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(parts))) as pool:
            pool.map(_delete, parts)  # a round trip each: in parallel too


def _delete(blob: Blob) -> None:
    with contextlib.suppress(Exception):  # never uploaded, or gone: the next start cleans what is left
        blob.delete()
