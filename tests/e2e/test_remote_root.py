"""The e2e tier of tests/unit/test_remote_root.py (the same subject; its helpers are there)."""

from __future__ import annotations

import sys
from pathlib import Path

from gpu_train.contract import REMOTE_ROOT_BEFORE
from tests.unit.test_project import (
    sshd,  # noqa: F401 (a fixture)
    started_run,
)
from tests.unit.test_stack_select import OurProject


def test_a_fresh_host_gets_the_hidden_root_and_an_old_one_keeps_its_runs(tmp_path: Path, sshd) -> None:
    proj = OurProject(tmp_path)
    fresh, old = sshd("127.0.14.10"), sshd("127.0.14.11")

    def stack(name: str, server, root: str = "") -> None:
        proj.stack(
            name,
            f"  gpu-train:hosts: ['{server.spec}']\n  gpu-train:sshKey: {server.client_key}\n"
            f"  gpu-train:python: {sys.executable}\n  gpu-train:venv: false\n" + root,
        )

    # Runs made before the default changed: the stack said nothing, so they went to ~/gpu-train.
    stack("old", old, f"  gpu-train:remoteRoot: {REMOTE_ROOT_BEFORE}\n")
    before = started_run(proj.run("train", "--stack", "old", "--command", "echo before", check=True))
    proj.run("logs", "--stack", "old", "--run", before, "--follow", check=True)
    stack("old", old)  # now the same stack on this version
    status = proj.run("status", "--stack", "old", check=True)
    assert before in status.stdout and "remoteRoot's old default" in status.stderr, status.stderr
    after = started_run(proj.run("train", "--stack", "old", "--command", "echo after", check=True))
    home = old.dir / "home"
    assert (home / "gpu-train" / "runs" / after).is_dir() and not (home / ".gpu-train").exists()
    again = proj.run("status", "--stack", "old", check=True)  # asked once, said once
    assert before in again.stdout and after in again.stdout and "old default" not in again.stderr

    stack("fresh", fresh)
    run = started_run(proj.run("train", "--stack", "fresh", "--command", "echo new", check=True))
    home = fresh.dir / "home"
    assert (home / ".gpu-train" / "runs" / run).is_dir() and not (home / "gpu-train").exists()
    assert "old default" not in proj.run("status", "--stack", "fresh", check=True).stderr


def test_a_cluster_asks_each_node_before_the_code_hop(tmp_path: Path, sshd) -> None:
    # Node 1 has runs under the old default, node 0 is fresh: node 0 passes the code on to node 1's own root.
    proj = OurProject(tmp_path)
    a = sshd("127.0.14.14")
    b = sshd("127.0.14.15", a.client_key)  # one key for both (the stack's sshKey)
    common = f"  gpu-train:sshKey: {a.client_key}\n  gpu-train:python: {sys.executable}\n  gpu-train:venv: false\n"
    proj.stack("old", f"  gpu-train:hosts: ['{b.spec}']\n  gpu-train:remoteRoot: {REMOTE_ROOT_BEFORE}\n" + common)
    before = started_run(proj.run("train", "--stack", "old", "--command", "echo before", "--follow", check=True))
    proj.stack("duo", f"  gpu-train:hosts: ['{a.spec}', '{b.spec}']\n" + common)
    run = proj.run("train", "--stack", "duo", "--command", "echo $NODE_RANK", "--follow", check=True)
    rid = started_run(run)
    assert "remoteRoot's old default" in run.stderr and run.stderr.count("remoteRoot's old default") == 1
    assert (a.dir / "home" / ".gpu-train" / "runs" / rid).is_dir() and not (a.dir / "home" / "gpu-train").exists()
    assert (b.dir / "home" / "gpu-train" / "runs" / rid).is_dir() and not (b.dir / "home" / ".gpu-train").exists()
    assert (b.dir / "home" / "gpu-train" / "runs" / before).is_dir()
