"""A big checkpoint's upload to the bucket over a long link: one stream against parts in parallel.

The uploader's own ``put`` (agent/upload.py, Google's client) sends a file of BENCH_MB MiB to
a gcp-storage-emulator on loopback through bench/delayproxy.py, which adds BENCH_DELAY_MS each way
and holds at most BENCH_WINDOW_KB in flight per connection (4 MiB: Linux's default largest send
buffer, net.ipv4.tcp_wmem), so each connection moves at most its window per round trip, as over a
real long link. Once as one
resumable upload, once as parts sent in parallel and composed (agent/composite.py), each
verified by CRC32C as the uploader does. Prints both times and their ratio; BENCH_SIZES (MiB,
comma-separated) adds a row per size, to place the threshold.

(The emulator is a Python server on this shared 2-core machine: it, not the link, may be the limit
at zero delay. Real Cloud Storage and a real WAN are not measured.)

Run: .venv/bin/python bench/bucket_parallel.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

if TYPE_CHECKING:
    from google.cloud import storage

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from delayproxy import DelayProxy  # noqa: E402

from agent import composite, upload  # noqa: E402
from tests.gcs import Emulator  # noqa: E402

DELAY = float(os.environ.get("BENCH_DELAY_MS", "50")) / 1000
WINDOW = int(os.environ.get("BENCH_WINDOW_KB", "4096")) << 10
SIZES = [int(x) for x in os.environ.get("BENCH_SIZES", os.environ.get("BENCH_MB", "256")).split(",")]


def timed(bucket: storage.Bucket, path: Path, parallel: bool) -> float:
    st = path.stat()
    name = f"bench/{path.name}.{'parallel' if parallel else 'single'}"
    started = time.perf_counter()
    if parallel:
        with mock.patch.object(composite, "PARALLEL_FROM", 0):  # every size in parts, to compare at each
            got = upload.put(bucket, name, str(path), (st.st_size, st.st_mtime_ns), "bench-parts/", path.name)
    else:
        got = upload.put(bucket, name, str(path), (st.st_size, st.st_mtime_ns))
    took = time.perf_counter() - started
    assert got is not None and got["size"] == st.st_size
    return took


def main() -> None:
    from google.cloud import storage

    print(
        f"{DELAY * 1000:.0f} ms each way ({DELAY * 2000:.0f} ms round trip), {WINDOW >> 10} KiB in flight per "
        f"connection; parts of at least "
        f"{composite.PART_MIN >> 20} MiB, at most {composite.MAX_PARTS}, {composite.WORKERS} at once"
    )
    with tempfile.TemporaryDirectory(prefix="bench-parallel-") as t:
        tmp = Path(t)
        emulator = Emulator("bench", tmp / "emulator.log", threaded=True)
        proxy = DelayProxy(("127.0.16.1", 0), ("127.0.0.1", emulator.port), DELAY, WINDOW).start()
        try:
            with mock.patch.dict(os.environ, {"STORAGE_EMULATOR_HOST": f"http://{proxy.address[0]}:{proxy.address[1]}"}):
                bucket = storage.Client().bucket("bench")
            for mb in SIZES:
                path = tmp / f"ckpt-{mb}.bin"
                path.write_bytes(os.urandom(mb << 20))
                single = timed(bucket, path, parallel=False)
                parallel = timed(bucket, path, parallel=True)
                parts = len(composite.slices(mb << 20, parallel_from=0))
                print(
                    f"{mb:>6} MiB: one stream {single:6.2f} s ({mb / single:6.1f} MiB/s), {parts:>2} parts in "
                    f"parallel {parallel:6.2f} s ({mb / parallel:6.1f} MiB/s): {single / parallel:.2f}x",
                    flush=True,
                )
                path.unlink()
        finally:
            proxy.close()
            emulator.stop()


if __name__ == "__main__":
    main()
