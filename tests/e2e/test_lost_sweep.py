"""A sweep whose start's connection is lost after the host took it: the link is cut while the host starts the
sweep's first trial (its record kept, its queue going), before `sweep-start` can answer. The laptop asks the
host by the sweep's staged code's name over a new connection (`launch-outcome --sweep`, as a launch is asked)
and says what is true: the sweep started, once, on one host and on every node of a cluster; and a cluster
node that cannot be asked again, or that refuses the sweep, leaves no other node's sweep going. Real sshd, screen and rsync, each node
behind a proxy that can drop its connections; the hosts' `screen` holds a trial's start at a marker so
that the cut falls exactly there (tests/e2e/test_lost_launch.py's Hosts). Loopback 127.0.45.x."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpu_train.errors import ExitStatus
from tests.conftest import run_fab
from tests.e2e.test_lost_launch import Hosts

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

NET = "127.0.45"


def hosts_of(tmp: Path, count: int) -> Hosts:
    hosts = Hosts(tmp, count, NET)
    (hosts.cwd / "README").write_text("each trial is given by --command\n")  # (the sweep's code: this folder)
    run_fab(hosts.env, hosts.cwd, "status", check=True)  # first contact: the host keys are learned
    return hosts


def cut_at_the_start(hosts: Hosts, node: int, values: str, job: str, gone: bool = False) -> subprocess.CompletedProcess[str]:
    """`sweep` whose link to ``node`` drops while that host starts its first trial (the sweep kept, before
    `sweep-start` answered), and with ``gone`` stays down: what the laptop said."""
    sweep = ("sweep", "--command", job, "--name", "lost", "--slots", "1", "--values", values)
    return hosts.cut_as_it_starts(node, lambda: hosts.fab(*sweep), gone)


def trials(hosts: Hosts, node: int) -> list[str]:
    runs = hosts.root(node) / "runs"
    return sorted(p.name for p in runs.iterdir()) if runs.exists() else []


def kept(hosts: Hosts, node: int) -> dict[str, object]:
    return json.loads((hosts.root(node) / "sweeps" / "lost" / "sweep.json").read_text())


@pytest.mark.parametrize("shared", [True, False], ids=["over the shared connection", "over its own login"])
def test_a_sweep_started_as_its_link_dropped_is_reported_started_once(tmp_path: Path, shared: bool) -> None:
    hosts = hosts_of(tmp_path, 1)
    try:
        if not shared:  # the sweep logs in itself (paramiko), as the first task after a minute does
            hosts.end_shared_connection()
        said = cut_at_the_start(hosts, 0, "x=1", "echo trial $GPU_TRAIN_SWEEP")
        assert said.returncode == 0, said.stderr
        [trial] = trials(hosts, 0)  # one trial started: the sweep was not refused, nor started twice
        assert trial.startswith("lost_t0_x1_")
        assert said.stdout.startswith(f"sweep lost: 1 trials over 1 slot(s); started 1: {trial}\n"), said.stdout
        assert "connecting again to ask whether sweep lost started" in said.stderr
        assert "connected again: sweep lost had started" in said.stderr
        assert hosts.ended(0, trial) == "succeeded" and "trial lost" in (hosts.root(0) / "runs" / trial / "log").read_text()
    finally:
        hosts.stop()


def test_a_cluster_whose_node_lost_its_link_as_its_sweep_started_sweeps_on_every_node(tmp_path: Path) -> None:
    hosts = hosts_of(tmp_path, 2)
    try:
        said = cut_at_the_start(hosts, 1, "x=1,2", "echo trial")  # node 0's link holds
        assert said.returncode == 0, said.stderr
        assert "sweep lost: 2 trials over 2 slot(s); started 2" in said.stdout, said.stdout
        assert "connected again: sweep lost had started" in said.stderr
        for node in (0, 1):  # each node's share ran, none was stopped
            [trial] = trials(hosts, node)
            assert trial.startswith(f"lost_t{node}_x{node + 1}_") and hosts.ended(node, trial) == "succeeded", node
            assert not kept(hosts, node).get("stopped")
    finally:
        hosts.stop()


def test_a_cluster_node_that_cannot_be_asked_again_stops_the_other_nodes_sweeps(tmp_path: Path) -> None:
    hosts = hosts_of(tmp_path, 2)
    try:
        said = cut_at_the_start(hosts, 1, "x=1,2", "sleep 60", gone=True)  # node 1's link stays down
        assert said.returncode == ExitStatus.UNREACHABLE and not said.stdout, said.stderr
        assert f"node 1: the connection to {hosts.proxies[1].address[0]}" in said.stderr, said.stderr
        assert "sweep lost may be running there; `fab sweep status --sweep lost` says" in said.stderr
        assert "sweep lost was stopped on node 0 (no half a cluster)" in said.stderr
        [trial] = trials(hosts, 0)  # node 0's sweep: no more trials start, the one at work stopped
        assert kept(hosts, 0)["stopped"] is True and hosts.ended(0, trial) == "stopped"
    finally:
        hosts.stop()


def test_a_cluster_sweep_refused_on_one_node_is_stopped_on_the_others(tmp_path: Path) -> None:
    """Node 1 still has a sweep of that name going (a trial left to start): it refuses the new one, so node 0's,
    started meanwhile, is stopped: every node's sweep going, or none (before: node 0's went on alone)."""
    hosts = hosts_of(tmp_path, 2)
    try:
        old = hosts.root(1) / "sweeps" / "lost"
        old.mkdir(parents=True)
        job = {"runId": "lost_20200101_000000", "base": "lost", "command": "true"}
        trial = {"index": 0, "values": {"x": 9}, "args": [], "base": "lost_t0_x9", "node": 1}
        old.joinpath("sweep.json").write_text(
            json.dumps({"name": "lost", "stamp": "_20200101_000000", "job": job, "trials": [trial], "slots": [[]], "node": 1})
        )
        said = run_fab(hosts.env, hosts.cwd, "sweep", "--command", "sleep 60", "--name", "lost", "--slots", "1", "--values", "x=1,2")
        assert said.returncode == ExitStatus.FAILED and not said.stdout, said.stderr
        assert "node 1: sweep 'lost' is still going here (1 trial(s) left)" in said.stderr
        assert "sweep lost was stopped on node 0 (no half a cluster)" in said.stderr
        [trial0] = trials(hosts, 0)
        assert kept(hosts, 0)["stopped"] is True and hosts.ended(0, trial0) == "stopped"
        assert kept(hosts, 1)["stamp"] == "_20200101_000000" and not kept(hosts, 1).get("stopped")  # node 1's own, untouched
    finally:
        hosts.stop()
