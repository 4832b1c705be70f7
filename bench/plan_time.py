"""How long `scripts/plan` takes end to end (target: under 4 s), against `python -c pass` as a floor.

Run: .venv/bin/python bench/plan_time.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, check=False, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    floor = timed([sys.executable, "-c", "pass"])
    for stack in ("t4-spot", "l4", "a100", "h100-spot"):
        t = timed([str(ROOT / "scripts" / "plan"), "--stack", stack])
        print(f"scripts/plan --stack {stack:<10} {t:5.2f} s  (target < 4 s; python start-up {floor:.2f} s)")


if __name__ == "__main__":
    main()
