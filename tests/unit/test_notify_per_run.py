"""Each run's end goes to its own stack's webhook. One REMOTE_ROOT serves every stack and project that
reaches a host as this user, and the host kept one webhook (notify.url, the last launch's): a run's end,
its last log line included, went to whichever stack launched last (another team's channel), or nowhere.

The agent's real launch and wrapper (no sshd: the agent is run as the laptop's call runs it), two loopback
webhooks.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

from agent import notify
from tests.conftest import ROOT
from tests.unit.test_bucket_last_pass import AGENT_SHIM
from tests.webhook import Webhook


def launch(root: Path, run: str, command: str, url: str | None) -> None:
    """The agent's launch of ``run`` (its code staged), as a stack with webhook ``url`` sends it."""
    (root / "staging" / run).mkdir(parents=True)
    spec = {"runId": run, "base": run.split("_")[0], "command": command, "python": sys.executable, "notify": url}
    done = subprocess.run(
        [sys.executable, "-m", "agent", "--root", str(root), "launch", "-"],
        cwd=ROOT,
        input=base64.b64encode(json.dumps(spec).encode()) + b"\n",
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0 and json.loads(done.stdout)["runId"] == run, done


def ended(root: Path, run: str) -> None:
    state, deadline = root / "runs" / run / "state.json", time.monotonic() + 60
    while json.loads(state.read_text()).get("state") not in ("succeeded", "failed", "stopped"):
        assert time.monotonic() < deadline, f"{run} did not end: {state.read_text()}"
        time.sleep(0.05)


def test_a_runs_end_goes_to_its_own_stacks_webhook(tmp_path: Path) -> None:
    root, release = tmp_path / "root", tmp_path / "release"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "gpu-train-agent").write_text(AGENT_SHIM)  # where the wrapper finds the agent
    team, mine = Webhook("127.0.55.3"), Webhook("127.0.55.4")
    try:
        launch(root, "mine_20250101_000000", f"while [ ! -e {release} ]; do sleep 0.05; done; echo my private line", mine.url)
        launch(root, "team_20250101_000000", "echo the team line", team.url)  # another stack, launched later
        team.wait_for("team_20250101_000000 succeeded")
        launch(root, "quiet_20250101_000000", "true", None)  # a stack without a webhook, launched last
        ended(root, "quiet_20250101_000000")
        release.touch()
        assert "my private line" in mine.wait_for("mine_20250101_000000 succeeded")
        assert [t for t in team.texts() if "mine_" in t or "quiet_" in t] == []
        assert mine.texts() == [mine.wait_for("mine_")]  # (and not the others')
        assert (root / notify.KEPT / "mine_20250101_000000.url").stat().st_mode & 0o777 == 0o600
        assert "notify" not in json.loads((root / "runs" / "mine_20250101_000000" / "spec.json").read_text())
    finally:
        team.close()
        mine.close()
