"""A sweep across a reboot of a booted systemd guest: the trials at work are interrupted by the orderly
shutdown, the boot unit resumes each in its own slot from its own checkpoint, and the queue goes on
from the trials' ends (each in its own unit) until the best is named."""

from __future__ import annotations

import json
import subprocess

from tests.e2e.test_sweep import TRIAL
from tests.guest.test_lifecycle import vm  # noqa: F401 (the fixture)


def test_a_sweep_goes_on_across_a_reboot(vm) -> None:
    guest, user = vm(spot=False, torch=False)
    (user.cwd / "train.py").write_text(TRIAL)
    subprocess.run(["git", "init", "-q"], cwd=user.cwd, check=True)
    out = user.fab(
        "sweep",
        *("--script", "train.py", "--name", "grid", "--slots", "2", "--resume-args", "--resume"),
        *("--values", "lr=0.001,0.01", "--values", "bs=16,32"),
        check=True,
    ).stdout
    assert "grid: 4 trials over 2 slot(s); started 2" in out, out
    runs = user.root / "runs"

    def seen(run: str) -> list[dict]:
        path = runs / run / "job" / "seen.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def trials() -> list[str]:
        return sorted(p.name for p in runs.glob("grid_t*")) if runs.is_dir() else []

    first = user.wait_for("two trials at work", lambda: (t := trials()) and len(t) == 2 and all(seen(r) for r in t) and t)
    assert sorted(seen(r)[0]["slot"] for r in first) == ["0", "1"]
    guest.power_off()
    assert [user.state(r)["state"] for r in first] == ["interrupted", "interrupted"]

    guest.boot()
    for r in first:  # resumed by the boot unit, each from its checkpoint, in its own slot
        again = user.wait_for(f"{r} resumed", lambda r=r: len(seen(r)) == 2 and seen(r))
        assert again[1]["start"] == 5 and again[1]["slot"] == again[0]["slot"]
        assert user.state(r)["resumes"] == 1
    assert trials() == first  # both slots held: nothing new yet
    for r in first:
        (runs / r / "job" / "release").write_text("")
    rest = user.wait_for("the last two trials", lambda: (t := trials()) and len(t) == 4 and all(seen(r) for r in t) and t)
    for r in rest:
        (runs / r / "job" / "release").write_text("")
    for r in rest:
        user.wait_for(f"{r} to succeed", lambda r=r: user.state(r).get("state") == "succeeded")
    best = json.loads(user.fab("sweep", "best", "--sweep", "grid", "--metric", "loss", "--json", check=True).stdout)
    assert best["runId"].startswith("grid_t2_lr0p01_bs16"), best
