"""Data from the bucket: copied to local disk before the job, or read on demand as a FUSE mount reads it?

Measured against gcp-storage-emulator behind bench/delayproxy.py (a fixed delay each way: a long link on
loopback), with Google's client, for many small files and for a few large ones. Each way ends when the
job has read every file once (one epoch):

- copy, one by one: what the host does before a run today (agent/upload.py's pull_data: each
  object downloaded in turn), then the epoch from local disk;
- copy, parallel: Google's transfer manager (download_many_to_path for the small files,
  download_chunks_concurrently for the large ones, WORKERS threads), then the epoch from local disk;
- mount, 1 reader / WORKERS readers: what a mount without a file cache does for each file the job opens
  (gcsfuse's default): a listing of the folder, then per file a metadata request (the lookup behind
  open/stat) and one sequential read of its bytes; by one reader, and by WORKERS at once (a DataLoader's
  workers).

The emulator as shipped serves one connection at a time (Python's HTTPServer: a kept-alive connection
holds it), which no parallel client can be measured against; Cloud Storage serves many at once. So it
runs here on ThreadingHTTPServer (one thread per connection, the rest of it unchanged), still bound by
one Python process on this machine's cores. (With no delay at all the relay itself stalls parallel
connections: 1 ms each way is the least measured.) The link adds latency only, no bandwidth limit:
large files move at the emulator's and the client's speed.

Not measured (no gcsfuse here: no apt package, none on PyPI, no internet): gcsfuse itself, its stat,
type and optional file caches, its read-ahead, the kernel's page cache over a mount, and a later
epoch (copied data is read from local disk again; an uncached mount goes to the bucket again).

BENCH_DELAY_MS (one way; default 1,10,25: round trips of 2, 20 and 50 ms), BENCH_SMALL (files, default 400, of 16 KiB),
BENCH_LARGE (files, default 4, of BENCH_LARGE_MB 32), BENCH_WORKERS (8).
Run: .venv/bin/python bench/bucketdata.py
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from google.cloud import storage

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from delayproxy import DelayProxy  # noqa: E402

from tests.gcs import EMULATOR, free_port  # noqa: E402  (the tests' emulator)

DELAYS = [float(d) / 1000 for d in os.environ.get("BENCH_DELAY_MS", "1,10,25").split(",")]
SMALL, SMALL_KB = int(os.environ.get("BENCH_SMALL", "400")), 16
LARGE, LARGE_MB = int(os.environ.get("BENCH_LARGE", "4")), int(os.environ.get("BENCH_LARGE_MB", "32"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "8"))


def client(url: str) -> storage.Client:
    from google.cloud import storage

    os.environ["STORAGE_EMULATOR_HOST"] = url  # Google's own variable, read when a client is made
    return storage.Client()


def epoch(folder: Path) -> int:
    """The job's epoch over local files: every file read once."""
    return sum(len(p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file())


def copy_one_by_one(gcs: storage.Client, bucket: str, prefix: str, into: Path) -> int:
    for blob in gcs.list_blobs(bucket, prefix=prefix):
        path = into / blob.name[len(prefix) :]
        path.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(path), checksum="crc32c")
    return epoch(into)


def copy_parallel(gcs: storage.Client, bucket: str, prefix: str, into: Path) -> int:
    from google.cloud.storage import transfer_manager as tm

    blobs = list(gcs.list_blobs(bucket, prefix=prefix))
    small = [b.name for b in blobs if b.size < 32 << 20]
    for result in tm.download_many_to_path(
        gcs.bucket(bucket), small, destination_directory=str(into), max_workers=WORKERS, worker_type=tm.THREAD, raise_exception=True
    ):
        assert result is None, result
    for b in (b for b in blobs if b.size >= 32 << 20):
        path = into / b.name
        path.parent.mkdir(parents=True, exist_ok=True)
        tm.download_chunks_concurrently(b, str(path), chunk_size=8 << 20, max_workers=WORKERS, worker_type=tm.THREAD)
    return epoch(into)


def mounted(readers: int) -> Callable[[storage.Client, str, str, Path], int]:
    def read(gcs: storage.Client, bucket: str, prefix: str, _into: Path) -> int:
        names = [b.name for b in gcs.list_blobs(bucket, prefix=prefix)]  # readdir
        store = gcs.bucket(bucket)

        def one(name: str) -> int:
            blob = store.get_blob(name)  # lookup: open() and stat() ask for the object's metadata
            return len(blob.download_as_bytes(checksum=None))  # the file's bytes, read in order

        with ThreadPoolExecutor(readers) as pool:
            return sum(pool.map(one, names))

    return read


def measure(far_url: str, work: Path, delay: float) -> None:
    ways = {
        "copy, one by one": copy_one_by_one,
        "copy, parallel (transfer manager)": copy_parallel,
        "mount, 1 reader": mounted(1),
        f"mount, {WORKERS} readers": mounted(WORKERS),
    }
    print(f"\n== emulator behind a {delay * 2000:g} ms round trip; {WORKERS} workers; seconds until one epoch is read")
    for kind, prefix, what in (
        ("small", "small/", f"{SMALL} files of {SMALL_KB} KiB"),
        ("large", "large/", f"{LARGE} files of {LARGE_MB} MiB"),
    ):
        took = {}
        into = work / "local" / kind
        for name, way in ways.items():
            shutil.rmtree(into, ignore_errors=True)
            into.mkdir(parents=True)
            started = time.perf_counter()
            got = way(client(far_url), "data", prefix, into)  # a client of its own: new connections
            took[name] = time.perf_counter() - started
            expect = SMALL * (SMALL_KB << 10) if kind == "small" else LARGE * (LARGE_MB << 20)
            assert got == expect, (name, got, expect)
            if name.startswith("copy, parallel"):
                started = time.perf_counter()
                epoch(into)
                again = time.perf_counter() - started
        base = took["copy, parallel (transfer manager)"]
        print(f"{what}:")
        for name, seconds in took.items():
            print(f"  {name:<36} {seconds:7.2f} s   x{seconds / base:5.2f} of the parallel copy")
        print(f"  (each later epoch: {again:.2f} s from local disk after a copy; an uncached mount reads the bucket again)")


THREADED = (
    "import http.server as h, runpy, sys; h.HTTPServer = h.ThreadingHTTPServer; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def threaded_emulator(port: int, log: Path) -> subprocess.Popen[bytes]:
    """gcp-storage-emulator, unchanged but for a thread per connection, in memory, with the bucket `data`."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            THREADED,
            EMULATOR,
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--in-memory",
            "--default-bucket",
            "data",
            "--quiet",
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return proc
        time.sleep(0.1)
    raise SystemExit(f"the emulator did not start (see {log})")


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="bucketdata-"))
    port = free_port()
    emu = threaded_emulator(port, work / "emulator.log")
    proxy = DelayProxy(("127.0.16.7", 0), ("127.0.0.1", port), 0.0).start()
    far_url = f"http://{proxy.address[0]}:{proxy.address[1]}"
    try:
        # Uploaded through the proxy (with no delay yet): the emulator writes each object's mediaLink, which
        # Google's client downloads from, with the address the upload came to.
        store = client(far_url).bucket("data")
        names = [(f"small/{i // 100:02d}/{i:05d}.jpg", SMALL_KB << 10) for i in range(SMALL)] + [
            (f"large/shard-{i:02d}.bin", LARGE_MB << 20) for i in range(LARGE)
        ]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda item: store.blob(item[0]).upload_from_string(os.urandom(item[1])), names))
        for delay in DELAYS:
            proxy.delay = delay  # from here on, each new connection is a link this long
            measure(far_url, work, delay)
    finally:
        proxy.close()
        os.killpg(emu.pid, signal.SIGKILL)
        emu.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
