"""The first thing to run: gpu-train end to end on this machine, no cloud account needed.

A throwaway sshd on loopback stands in for a GPU box (an "SSH stack"); the example trains on it
under screen; we follow its log, look at its status, fetch its checkpoints, and tear it down.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_train.errors import CommandFailed, ExitStatus, leave  # noqa: E402
from remote.loopback import Sshd  # noqa: E402

GPU_TRAIN = str(Path(sys.executable).parent / "gpu-train")  # the command a user runs (this venv's)


def step(title: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    print(f"\n== {title}\n$ gpu-train {shlex.join(args)}", flush=True)
    result = subprocess.run([GPU_TRAIN, *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise CommandFailed(
            f"demo: `gpu-train {shlex.join(args)}` exited {result.returncode}", command=shlex.join(args), exited=result.returncode
        )
    return result


def main() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-train-demo-") as tmp:
        work = Path(tmp)
        sshd = Sshd(work / "sshd", "127.0.0.2").start()
        try:
            stack = sshd.stack_file(work / "stacks", "demo", work / "host", sys.executable)
            print(f"A throwaway sshd listens on {sshd.address}:{sshd.port}. The SSH stack {stack.name}:")
            print("  " + stack.read_text().replace("\n", "\n  ").rstrip())
            env = {
                **os.environ,
                "GPU_TRAIN_STACKS_DIR": str(work / "stacks"),
                "GPU_TRAIN_HOME": str(work / "state"),
                "GPU_TRAIN_STACK": "demo",
            }
            step(
                "Sync the example and start it under screen",
                "train",
                "--dir",
                "examples",
                "--script",
                "train.py",
                "--args",
                "--steps 300 --checkpoint-every 100",
                env=env,
            )
            step("Follow its log until it ends (exit code = the job's)", "logs", "--follow", "--lines", "0", env=env)
            step("Status of every run", "status", env=env)
            step("Bring the checkpoints home (incremental, resumable, verified)", "fetch", env=env)
            fetched = sorted((ROOT / "runs" / "demo").glob("*/checkpoints/*.pt"))
            print(f"\nfetched: {', '.join(str(p.relative_to(ROOT)) for p in fetched[-3:])}")
        finally:
            sshd.stop()
    print(
        f"\nDone in {time.monotonic() - started:.0f} s; the sshd is stopped. On Google Cloud the same tasks run "
        "after `pulumi up` (see README)."
    )
    return ExitStatus.OK


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CommandFailed as e:
        leave(e)
