"""The slow tier of tests/unit/test_agent_bundle.py (the same subject; its helpers are there): many real processes at once."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from agent import bundle
from tests.unit.test_agent_bundle import (
    run,
    versions,
)


@pytest.mark.slow
def test_two_versions_at_once_both_answer_and_an_unused_one_goes_after_a_day(tmp_path: Path) -> None:
    """Two laptops (or checkouts) with different agents call one host at the same time: every call
    answers (neither deletes the folder the other imports from); a version unused for a day goes."""
    root = tmp_path / "gpu-train"
    one, two = versions()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    calls = [
        subprocess.Popen(
            ["bash", "-c", bundle.agent_command(str(root), "status", cli="gpu-train", zipapp=z)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
        for z in (one, two)
    ]
    for call in calls:
        out, err = call.communicate(timeout=60)
        assert call.returncode == 0 and json.loads(out)["root"] == str(root), err
    bin_ = root / "bin"
    assert len(list(bin_.glob(f"{bundle.UNPACKED}*"))) == 2
    assert not [p for p in bin_.iterdir() if ".tmp." in p.name]
    day_ago = time.time() - 2 * 86400
    for folder in bin_.glob(f"{bundle.UNPACKED}*"):
        os.utime(folder, (day_ago, day_ago))
    run(bundle.agent_command(str(root), "status", cli="gpu-train"))  # a third version, unpacked: the unused two go
    [left] = bin_.glob(f"{bundle.UNPACKED}*")
    assert (left / bundle.PACKAGE / "cli.py").read_bytes() == bundle.lean((bundle.HERE / "cli.py").read_bytes())
