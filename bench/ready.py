"""Ready in seconds: a fresh host's first train against pip by hand, a rebuilt venv with uv's cache
kept, and `train` (unchanged code) and `status` over a 100 ms link against `ssh host true`.

Goals (issue "Ready in seconds"): first train <= 0.5x pip by hand; a rebuilt venv <= 0.15x; over
100 ms, `train` with unchanged code <= 1.0 s and `status` <= 0.6 s with a warm connection.

The host is a loopback sshd (this machine, as you; its sessions' HOME a fresh folder, so no cache of
pip's or uv's is warm) whose Python is the system's /usr/bin/python3, with the real PyPI as its
index. REQUIREMENTS is a small but real list (about 8 MB of wheels). "pip by hand" is what a user
types on a fresh host: `python3 -m venv --system-site-packages` (as gpu-train makes it), `pip
install -r requirements.txt` with an empty pip cache, and the job to its first line. gpu-train's times run from the command to the
job's first line (`train --follow`), the code sync, the uv fetch and the venv included.

Run: flock /tmp/heavy.lock .venv/bin/python bench/ready.py   (needs PyPI; about a minute)
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from delayproxy import DelayProxy  # noqa: E402

from remote.loopback import Sshd  # noqa: E402

GPU_TRAIN = str(Path(sys.executable).parent / "gpu-train")
PYTHON = "/usr/bin/python3"
INDEX = "https://pypi.org/simple"
REQUIREMENTS = "requests\ntqdm\npyyaml\nrich\nsafetensors\nhuggingface_hub\n"
JOB = "import requests, tqdm, yaml, rich, safetensors, huggingface_hub\nprint('READY', flush=True)\n"
DELAY = 0.050  # each way: a 100 ms round trip
REBUILDS = 3  # the rebuilt venv and the floor: medians of this many


def pip_by_hand(work: Path) -> float:
    env = {**os.environ, "HOME": str(work / "home-pip"), "PIP_CACHE_DIR": str(work / "pip-cache"), "PIP_INDEX_URL": INDEX}
    (work / "home-pip").mkdir()
    req = work / "requirements.txt"
    req.write_text(REQUIREMENTS)
    t = time.perf_counter()
    subprocess.run([PYTHON, "-m", "venv", "--system-site-packages", str(work / "by-hand")], check=True, env=env)
    subprocess.run(
        [str(work / "by-hand" / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "-r", str(req)],
        check=True,
        env=env,
        capture_output=True,
    )
    subprocess.run([str(work / "by-hand" / "bin" / "python"), "-c", JOB], check=True, capture_output=True)
    return time.perf_counter() - t


def to_first_line(cmd: list[str], env: dict[str, Any], cwd: Path) -> float:
    """Seconds from the command to the job's READY line (the command then runs to its end)."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stderr is not None  # (both PIPE)
    took, out = None, []
    for line in proc.stdout:
        out.append(line)
        if took is None and line.strip() == "READY":
            took = time.perf_counter() - t
    err = proc.stderr.read()
    if proc.wait() != 0 or took is None:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{''.join(out)}\n{err}")
    return took


def timed(cmd: list[str], env: dict[str, Any], cwd: Path, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        time.sleep(1.0)  # a new second: a new run id for train
        t = time.perf_counter()
        subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True, stdin=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="gpu-train-ready-") as tmp:
        work = Path(tmp)
        by_hand = pip_by_hand(work)

        sshd = Sshd(work / "sshd", "127.0.25.1", setenv=f"PIP_INDEX_URL={INDEX}", quick_kex=False).start()
        proxy = DelayProxy(("127.0.25.2", 0), (sshd.address, sshd.port), DELAY).start()
        try:
            project = work / "proj"
            project.mkdir()
            (project / "requirements.txt").write_text(REQUIREMENTS)
            (project / "job.py").write_text(JOB)
            sshd.stack_file(work / "stacks", "lab", work / "remote", PYTHON)
            stack = work / "stacks" / "Pulumi.lab.yaml"
            stack.write_text(stack.read_text().replace("gpu-train:venv: false", "gpu-train:venv: true"))
            env = {
                **os.environ,
                "GPU_TRAIN_STACKS_DIR": str(work / "stacks"),
                "GPU_TRAIN_HOME": str(work / "state"),
                "GPU_TRAIN_STACK": "lab",
                "GPU_TRAIN_PROJECT": str(project),
            }
            train = [GPU_TRAIN, "train", "--script", "job.py", "--follow"]
            first = to_first_line(train, env, project)
            (venv,) = [p for p in (work / "remote" / "envs").iterdir() if p.is_dir()]  # envs/PROJECT-ID: the one venv
            rebuilds, floors = [], []
            for _ in range(REBUILDS):  # each in turn, so that a machine whose speed drifts moves both alike
                shutil.rmtree(venv)  # the venv gone, uv and its cache kept
                time.sleep(1.0)  # a new second: a new run id
                rebuilds.append(to_first_line(train, env, project))
                time.sleep(1.0)
                floors.append(to_first_line(train, env, project))  # nothing to make or install: the floor
            rebuilt, again = statistics.median(rebuilds), statistics.median(floors)
            cache = subprocess.run(["du", "-sh", str(work / "remote" / "cache" / "uv")], capture_output=True, text=True).stdout.split()[0]

            # The same host 100 ms away: a stack of its own through the delaying proxy.
            sshd.address, sshd.port = proxy.address
            sshd.stack_file(work / "stacks", "wan", work / "remote-wan", PYTHON)
            wenv = {**env, "GPU_TRAIN_STACK": "wan"}
            code = work / "wan-code"
            code.mkdir()
            for i in range(50):
                (code / f"m{i}.py").write_text("x = 1\n" * 50)
            wtrain = [GPU_TRAIN, "train", "--dir", str(code), "--command", "true", "--name", "bench"]
            subprocess.run(wtrain, env=wenv, cwd=project, check=True, capture_output=True)  # host key, first sync
            ssh = [
                "ssh",
                "-p",
                str(proxy.address[1]),
                "-i",
                str(sshd.client_key),
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
                "-o",
                "ControlPath=none",
                f"{sshd.user}@{proxy.address[0]}",
                "true",
            ]
            bare = timed(ssh, wenv, project)
            unchanged = timed(wtrain, wenv, project)
            status = timed([GPU_TRAIN, "status"], wenv, project)
        finally:
            proxy.close()
            sshd.stop()
    print(f"requirements: {REQUIREMENTS.strip().replace(chr(10), ', ')}; host Python {PYTHON}; index {INDEX}")
    print(f"  pip by hand (venv + pip install, cold)       {by_hand:6.2f} s")
    print(f"  gpu-train first train, fresh host, cold      {first:6.2f} s  {first / by_hand:.2f}x pip  goal <= 0.50x")
    print(
        f"  gpu-train, venv rebuilt, uv cache kept       {rebuilt:6.2f} s  {rebuilt / by_hand:.3f}x pip  goal <= 0.15x  (uv cache {cache})"
    )
    print(f"  gpu-train, nothing to install (the floor)    {again:6.2f} s  {again / by_hand:.2f}x pip  (these two: medians of {REBUILDS})")
    print(f"network: +{DELAY * 1000:.0f} ms each way through a TCP proxy; medians of 5")
    print(f"  ssh host true (one bare OpenSSH login)       {bare:6.2f} s")
    print(f"  gpu-train train, unchanged code (50 files)   {unchanged:6.2f} s  goal <= 1.0 s  ({unchanged / bare:.2f}x ssh true)")
    print(f"  gpu-train status, warm connection            {status:6.2f} s  goal <= 0.6 s  ({status / bare:.2f}x ssh true)")


if __name__ == "__main__":
    main()
