"""How long `scripts/plan` takes end to end for every example stack (goal, issue 36: the slowest <= 2 s),
against its anchor in the same run: Python starting and importing Pulumi's SDK and pulumi-gcp's top
level (what no plan can do without). Wall and CPU (user + system) of each, medians of RUNS, the
commands taken in turn so that a machine whose speed drifts moves them alike.

Run: .venv/bin/python bench/plan_time.py [RUNS]
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STACKS = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))
GOAL_S = 2.0


def timed(cmd: list[str], env: dict[str, Any]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=False, capture_output=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    # Users' Pythons keep compiled modules; a workplace that says not to would have every plan compile pulumi-gcp.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    commands = {"anchor": [sys.executable, "-c", "import pulumi, pulumi_gcp"]}
    commands.update({stack: [str(ROOT / "scripts" / "plan"), "--stack", stack] for stack in STACKS})
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, cmd in commands.items():
            got[name].append(timed(cmd, env))
    wall = {name: statistics.median(w for w, _ in got[name]) for name in got}
    cpu = {name: statistics.median(c for _, c in got[name]) for name in got}
    print(f"medians of {runs}; anchor: Python with Pulumi's SDK and pulumi-gcp's top level imported")
    print(f"  {'anchor':<28} {wall['anchor']:5.2f} s  cpu {cpu['anchor']:5.2f} s")
    for stack in STACKS:
        print(
            f"  scripts/plan --stack {stack:<14} {wall[stack]:5.2f} s  cpu {cpu[stack]:5.2f} s  {wall[stack] / wall['anchor']:4.1f}x anchor"
            f"  goal <= {GOAL_S} s: {'met' if wall[stack] <= GOAL_S else 'NOT met'}"
        )
    slowest = max(STACKS, key=lambda s: wall[s])
    print(f"  slowest: {slowest}, {wall[slowest]:.2f} s ({wall[slowest] / GOAL_S:.2f}x the goal)")


if __name__ == "__main__":
    main()
