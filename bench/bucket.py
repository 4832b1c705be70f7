"""A job's step time with and without the bucket uploader running next to it (gpu-train:bucket).

The job: fixed CPU work per step (numpy matmuls), a checkpoint of CKPT_MB written every EVERY steps
into JOB_DIR. Run once alone, once with the agent's uploader (agent/upload.py, the real one,
Google's client) sending JOB_DIR to a gcp-storage-emulator on loopback, as the wrapper starts it.
Prints the median and 95th percentile step time of each, and what the uploader verified.
(On loopback the emulator takes bytes at memory speed, so this measures the uploader's own cost on
the host's CPU and disk: hashing, reading, the client; not a real network's.)

BENCH_STEPS, BENCH_CKPT_MB, BENCH_EVERY change the job. Run: .venv/bin/python bench/bucket.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent import upload  # noqa: E402
from tests.gcs import Emulator  # noqa: E402  (the tests' emulator helper)

STEPS = int(os.environ.get("BENCH_STEPS", "3000"))
CKPT_MB = int(os.environ.get("BENCH_CKPT_MB", "64"))
EVERY = int(os.environ.get("BENCH_EVERY", "300"))
JOB = f"""
import os, time, numpy as np
a = np.random.rand(256, 256)
out = open(os.environ["STEP_TIMES"], "w")
for step in range({STEPS}):
    t = time.perf_counter()
    for _ in range(8):
        a = np.tanh(a @ a / 256)
    out.write(f"{{time.perf_counter() - t}}\\n")
    if step % {EVERY} == {EVERY} - 1:
        with open(os.path.join(os.environ["JOB_DIR"], f"ckpt-{{step}}.bin"), "wb") as f:
            f.write(os.urandom({CKPT_MB} << 20))
out.close()
"""


def one(tmp: Path, emulator: Emulator | None) -> list[float]:
    run = f"bench_{int(time.time())}_{'up' if emulator else 'alone'}"
    run_dir = tmp / "root" / "runs" / run
    (run_dir / "job").mkdir(parents=True)
    (run_dir / "code").mkdir()
    bucket = {"name": "bench", "prefix": f"b/{run}/", "parts": f"b/.gpu-train-parts/{run}/"}  # as gpu_train/jobs.py names them
    (run_dir / "spec.json").write_text(json.dumps({"runId": run, "base": "job", "bucket": bucket}))
    env = {
        **os.environ,
        "JOB_DIR": str(run_dir / "job"),
        "STEP_TIMES": str(tmp / f"{run}.times"),
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    uploader = None
    if emulator:
        env["STORAGE_EMULATOR_HOST"] = emulator.url
        log = open(tmp / f"{run}.upload.log", "wb")  # noqa: SIM115 (the uploader's; read at the end)
        uploader = subprocess.Popen(
            [sys.executable, "-m", "agent", "--root", str(tmp / "root"), "upload", run],
            stdin=subprocess.PIPE,
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=upload.in_background,
        )  # as the wrapper starts it
    subprocess.run([sys.executable, "-c", JOB], env=env, check=True)
    if uploader is not None:
        during = len(json.loads((run_dir / "bucket.json").read_text())["files"])
        print(f"  {during} checkpoint(s) verified in the bucket while the job ran")
        assert uploader.stdin is not None
        uploader.stdin.close()
        uploader.wait(600)
        record = json.loads((run_dir / "bucket.json").read_text())
        log.close()
        parallel = (tmp / f"{run}.upload.log").read_text().count("parts sent in parallel")
        print(
            f"  uploader: exit {uploader.returncode}, {len(record['files'])} checkpoint(s) verified in the bucket "
            f"({parallel} as parts in parallel), final={record['final']}"
        )
    return [float(x) for x in (tmp / f"{run}.times").read_text().split()]


def show(name: str, times: list[float]) -> float:
    med, p95 = statistics.median(times), sorted(times)[int(len(times) * 0.95)]
    print(f"{name:>22}: median {med * 1000:.2f} ms, p95 {p95 * 1000:.2f} ms over {len(times)} steps")
    return med


def main() -> None:
    print(f"{STEPS} steps, a {CKPT_MB} MiB checkpoint every {EVERY} steps")
    with tempfile.TemporaryDirectory(prefix="bench-bucket-") as t:
        tmp = Path(t)
        emulator = Emulator("bench", tmp / "emulator.log")
        try:
            alone = show("alone", one(tmp, None))
            uploaded = show("with the uploader", one(tmp, emulator))
            again = show("alone again", one(tmp, None))
        finally:
            emulator.stop()
    base = statistics.mean([alone, again])
    print(f"median step with uploads / without: {uploaded / base:.3f}")


if __name__ == "__main__":
    main()
