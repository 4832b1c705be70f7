"""The e2e tier of tests/unit/test_cluster.py (the same subject; its helpers are there)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from remote.loopback import Sshd, free_port
from tests.conftest import EXAMPLE, cluster_stack, fab_env, run_fab

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class Cluster:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.a = Sshd(tmp / "a", "127.0.0.2").start()
        self.b = Sshd(tmp / "b", "127.0.0.3", client_key=self.a.client_key).start()
        self.roots = [tmp / "node0", tmp / "node1"]
        cluster_stack(tmp / "stacks", "duo", [self.a.spec, self.b.spec], self.a.client_key)
        self.cwd = tmp / "work"
        self.cwd.mkdir()
        self.env = fab_env(tmp / "stacks", tmp / "home", "duo", self.cwd)

    def fab(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        return run_fab(self.env, self.cwd, *args, check=check, timeout=300)

    def state(self, node: int, run: str) -> dict:
        return json.loads((self.roots[node] / "runs" / run / "state.json").read_text())

    def log(self, node: int, run: str) -> str:
        path = self.roots[node] / "runs" / run / "log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        self.a.stop()
        self.b.stop()
        subprocess.run(["pkill", "-f", str(self.tmp)], check=False)


@pytest.fixture
def duo(tmp_path: Path):
    cluster = Cluster(tmp_path)
    yield cluster
    cluster.stop()


def test_two_node_torchrun_trains_one_model(duo: Cluster) -> None:
    port = free_port("127.0.0.2")
    out = duo.fab(
        "train",
        "--dir",
        str(EXAMPLE),
        "--script",
        "train.py",
        "--args",
        "--steps 60 --checkpoint-every 20",
        "--nproc",
        "1",
        "--port",
        str(port),
        "--env",
        "GLOO_SOCKET_IFNAME=lo",
        check=True,
    )
    run = out.stdout.split()[1]
    assert "on 2 nodes" in out.stdout and "syncing to 2 nodes" in out.stderr
    follow = duo.fab("logs", "--follow", "--all")
    assert follow.returncode == 0, follow.stdout + follow.stderr
    for node in (0, 1):
        log = duo.log(node, run)
        assert f"--nnodes 2 --node_rank {node} --nproc_per_node 1 --master_addr 127.0.0.2 --master_port {port}" in log
    losses = [re.findall(r"^step (\d+) loss ([\d.]+)$", duo.log(n, run), re.M) for n in (0, 1)]
    assert losses[0] and losses[0] == losses[1]  # both ranks log the same all-reduced loss
    assert "rank 1/2" in duo.log(1, run) and "rank 0/2" in duo.log(0, run)
    assert "[node 0] step 60" in follow.stdout and "[node 1] step 60" in follow.stdout
    job0, job1 = (duo.roots[n] / "runs" / run / "job" for n in (0, 1))
    assert sorted(p.name for p in (job0 / "checkpoints").iterdir()) == ["ckpt_00000020.pt", "ckpt_00000040.pt", "ckpt_00000060.pt"]
    assert not (job1 / "checkpoints").exists()  # node 0 writes the checkpoints
    status = json.loads(duo.fab("status", "--json", check=True).stdout)
    (r,) = status["runs"]
    assert r["state"] == "succeeded" and [n["state"] for n in r["nodes"]] == ["succeeded", "succeeded"]
    duo.fab("fetch", check=True)
    assert (duo.cwd / "runs" / "duo" / run / "checkpoints" / "ckpt_00000060.pt").is_file()
    duo.fab("fetch", "--all-nodes", check=True)  # node 0's at the top, node N's in node-N/
    assert (duo.cwd / "runs" / "duo" / run / "node-1" / "metrics.json").exists() is False
    assert (duo.cwd / "runs" / "duo" / run / "metrics.json").is_file()
    assert not (duo.cwd / "runs" / "duo" / run / "node-0").exists()


def test_a_killed_node_fails_the_run_and_stop_cleans_up_the_other(duo: Cluster, plain: str) -> None:
    cmd = 'echo "rank $NODE_RANK of $NNODES via $MASTER_ADDR:$MASTER_PORT"; echo "$TF_CONFIG"; sleep 60'
    out = duo.fab("train", "--dir", plain, "--command", cmd, "--name", "pair", "--ps", "0", check=True)
    run = out.stdout.split()[1]
    deadline = time.monotonic() + 30
    # Both printed their TF_CONFIG, and each wrapper has recorded its job's pid (a job may print first).
    while not all('"task"' in duo.log(n, run) and duo.state(n, run).get("pid") for n in (0, 1)):
        assert time.monotonic() < deadline, "the nodes did not start"
        time.sleep(0.2)
    assert "rank 1 of 2 via 127.0.0.2:29500" in duo.log(1, run)
    tf = json.loads(duo.log(1, run).splitlines()[-1])
    assert tf == {"cluster": {"chief": ["127.0.0.2:2222"], "worker": ["127.0.0.3:2222"]}, "task": {"type": "worker", "index": 0}}
    os.killpg(duo.state(1, run)["pid"], 9)  # node 1's job dies
    deadline = time.monotonic() + 30
    while duo.state(1, run).get("state") != "failed" and time.monotonic() < deadline:
        time.sleep(0.2)
    status = duo.fab("status", check=True).stdout
    assert "failed" in status and "node 1 failed (exit -9)" in status
    stopped = duo.fab("stop", "--grace", "1", check=True).stdout
    assert f"node 0: {run}: stopped" in stopped
    assert duo.state(0, run)["state"] == "stopped"
    assert not Path(f"/proc/{duo.state(0, run)['pid']}").exists()
    # A stopped run is restarted only when named; the whole group restarts, same run id and JOB_DIR on each node.
    assert "no interrupted run to resume" in duo.fab("resume").stderr
    assert f"{run}: restarted on 2 node(s) (resume 1)" in duo.fab("resume", "--run", run, check=True).stdout
    deadline = time.monotonic() + 30
    while not all(duo.log(n, run).count('"task"') == 2 for n in (0, 1)):
        assert time.monotonic() < deadline, "the group did not restart"
        time.sleep(0.2)
    assert [duo.state(n, run)["resumes"] for n in (0, 1)] == [1, 1]
    duo.fab("stop", "--grace", "1", check=True)
