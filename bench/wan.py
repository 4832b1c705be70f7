"""The everyday loop over a long link: `gpu-train status` and `gpu-train train` of unchanged code, 100 ms
round trip away, each against its anchor measured in the same run.

The link: a loopback sshd behind bench/delayproxy.py, 50 ms each way (tc/netem needs privileges this
machine does not give). The shared connection is warm, as it is for every task after the first within a
minute (remote/ssh/mux.py). The anchor is what no command can do without: one round trip over the shared
connection (`ssh true` riding on it: the ssh client's start and one exchange) plus Python's start with
gpu-train's tasks (`gpu-train --version`). Goals (issue 36): status <= 0.45 s, train of unchanged code
<= 0.7 s.

Each figure is the median of RUNS, the commands taken in turn (anchor, status, train, ...) so that a
machine whose speed drifts moves them alike; CPU is the commands' own user + system seconds (the
laptop's: Python and the ssh client; the host's agent runs under sshd, not counted).

Run: .venv/bin/python bench/wan.py [RUNS]
"""

from __future__ import annotations

import os
import resource
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
DELAY = 0.050  # each way: a 100 ms round trip
GOALS = {"status": 0.45, "train": 0.7}


def timed(cmd: list[str], env: dict[str, Any], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds (user + system of the command and what it waited for) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    with tempfile.TemporaryDirectory(prefix="gpu-train-wan-") as tmp:
        work = Path(tmp)
        sshd = Sshd(work / "sshd", "127.0.25.1", quick_kex=False).start()  # key exchange as a real host offers
        proxy = DelayProxy(("127.0.25.2", 0), (sshd.address, sshd.port), DELAY).start()
        try:
            sshd.address, sshd.port = proxy.address  # the stack names the proxy
            sshd.stack_file(work / "stacks", "wan", work / "remote", sys.executable)
            # Users' Pythons keep compiled modules; a workplace that says not to would have every command compile gpu-train.
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env.update(GPU_TRAIN_STACKS_DIR=str(work / "stacks"), GPU_TRAIN_HOME=str(work / "state"), GPU_TRAIN_STACK="wan")
            code = work / "code"
            code.mkdir()
            for i in range(50):
                (code / f"m{i}.py").write_text("x = 1\n" * 50)
            train = [GPU_TRAIN, "train", "--dir", str(code), "--command", "true", "--name", "bench"]
            subprocess.run(train, env=env, cwd=work, check=True, capture_output=True)  # host key, first sync, the shared connection
            from gpu_train.environment import Environment
            from remote.ssh import mux
            from remote.ssh.target import resolve

            target = resolve(Environment.from_os(env), "wan").for_node(0)
            host = target.hosts[0]
            path = mux.control_path(target, host)
            assert path is not None and mux.master_up(path), "no shared connection: the figures would not be the warm loop's"
            commands = {
                "round trip": [*mux.over_master(target, host, path), "true"],
                "start": [GPU_TRAIN, "--version"],
                "status": [GPU_TRAIN, "status"],
                "train": train,
                "logs": [GPU_TRAIN, "logs", "--lines", "20"],
                "follow": [*train[:-1], "bench-follow", "--follow"],  # (a name of its own: train may have used this second)
                "fetch": [GPU_TRAIN, "fetch", "--dest", str(work / "fetched")],
            }
            got: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
            for _ in range(runs):
                for name, cmd in commands.items():
                    got[name].append(timed(cmd, env, work))
                time.sleep(1.0)  # a new second: a new run id for the next train
        finally:
            proxy.close()
            sshd.stop()
    wall = {name: statistics.median(w for w, _ in got[name]) for name in got}
    cpu = {name: statistics.median(c for _, c in got[name]) for name in got}
    anchor = wall["round trip"] + wall["start"]
    print(f"network: +{DELAY * 1000:.0f} ms each way through a TCP proxy, shared connection warm; medians of {runs}")
    print(f"  one round trip (ssh true on the shared connection)  {wall['round trip']:5.2f} s  cpu {cpu['round trip']:5.2f} s")
    print(f"  Python's start (gpu-train --version)                {wall['start']:5.2f} s  cpu {cpu['start']:5.2f} s")
    print(f"  anchor: one round trip + Python's start             {anchor:5.2f} s")
    for name, what in (("status", "gpu-train status"), ("train", "gpu-train train, unchanged code (50 files)")):
        print(
            f"  {what:<51} {wall[name]:5.2f} s  cpu {cpu[name]:5.2f} s  {wall[name] / anchor:4.2f}x anchor"
            f"  goal <= {GOALS[name]} s ({GOALS[name] / anchor:4.2f}x)  {'met' if wall[name] <= GOALS[name] else 'NOT met'}"
        )
    print("  the rest of the everyday loop (no goal set):")
    for name, what in (
        ("logs", "gpu-train logs --lines 20"),
        ("follow", "gpu-train train --follow, a job that ends at once"),
        ("fetch", "gpu-train fetch, nothing new"),
    ):
        print(f"  {what:<51} {wall[name]:5.2f} s  cpu {cpu[name]:5.2f} s  {wall[name] / anchor:4.2f}x anchor")


if __name__ == "__main__":
    main()
