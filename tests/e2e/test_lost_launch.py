"""A launch whose connection is lost after the host took it: `train` of unchanged code, where the host goes
on by itself after "ready (reused)", and the link is cut while the host starts the run, before its
"launched" can come back. The laptop asks the host by the run's id over a new connection and says what is
true: the run trains, so it is reported started (once: no second run), on one host and on a cluster
(every node running, none stopped). Real sshd, screen and rsync; each node behind a proxy that can drop
its connections (bench/delayproxy.py); `screen` on the hosts holds a run's start at a marker, so that the
cut falls exactly there. Loopback 127.0.43.x."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_train.errors import ExitStatus
from remote.loopback import Sshd
from tests.conftest import FAB, ROOT, after_the_second_of, cluster_stack, fab_env, run_fab

sys.path.insert(0, str(ROOT / "bench"))
from delayproxy import DelayProxy

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

NET = "127.0.43"
# The host's screen, but a run's start (`screen -dmS`, agent/launch.py start_wrapper) waits while $HOLD
# exists: it leaves $HOLD.reached, then goes on once $HOLD.release is there.
HELD_SCREEN = """#!/bin/sh
if [ "$1" = "-dmS" ] && [ -e "$HOLD" ]; then
  : > "$HOLD.reached"
  while [ ! -e "$HOLD.release" ]; do sleep 0.02; done
fi
exec {screen} "$@"
"""
JOB = "echo trained on ${NODE_RANK:-0}"


class Hosts:
    """``count`` loopback hosts as one SSH stack `lost`, each reached through its own proxy."""

    def __init__(self, tmp: Path, count: int, net: str = NET):
        self.tmp = tmp
        fakebin = tmp / "fakebin"
        fakebin.mkdir()
        (fakebin / "screen").write_text(HELD_SCREEN.format(screen=shutil.which("screen")))
        (fakebin / "screen").chmod(0o755)
        self.sshds: list[Sshd] = []
        self.proxies: list[DelayProxy] = []
        key = None
        for i in range(count):
            sshd = Sshd(tmp / f"n{i}", f"{net}.{10 + i}", client_key=key, setenv=f"HOLD={self.hold(i)} PATH={fakebin}:{os.defpath}")
            self.sshds.append(sshd.start())
            key = sshd.client_key
            self.proxies.append(DelayProxy((f"{net}.{20 + i}", 0), (sshd.address, sshd.port), 0.0).start())
        hosts = [f"{s.user}@{p.address[0]}:{p.address[1]}" for s, p in zip(self.sshds, self.proxies, strict=True)]
        cluster_stack(tmp / "stacks", "lost", hosts, self.sshds[0].client_key)
        self.cwd = tmp / "work"
        self.cwd.mkdir()
        self.code = tmp / "code"
        self.code.mkdir()
        (self.code / "README").write_text("a job given by --command\n")
        self.env = fab_env(tmp / "stacks", tmp / "home", "lost", self.cwd)

    def hold(self, node: int) -> Path:
        return self.tmp / f"hold{node}"

    def root(self, node: int) -> Path:
        return self.tmp / f"node{node}"

    def train(self, *args: str, job: str = JOB) -> subprocess.Popen[str]:
        return self.fab("train", "--dir", str(self.code), "--command", job, "--name", "lost", *args)

    def fab(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [FAB, "--search-root", str(ROOT), *args],
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )

    def state(self, node: int, run: str) -> str | None:
        path = self.root(node) / "runs" / run / "state.json"
        return json.loads(path.read_text()).get("state") if path.exists() else None

    def ended(self, node: int, run: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while (state := self.state(node, run)) not in ("succeeded", "failed", "stopped"):
            assert time.monotonic() < deadline, f"node {node}: {run} did not end ({state})"
            time.sleep(0.05)
        return state

    def runs(self, node: int) -> list[str]:
        return sorted(p.name for p in (self.root(node) / "runs").iterdir())

    def end_shared_connection(self) -> None:
        """Close this user's shared OpenSSH connection to node 0 (remote/ssh/mux.py)."""
        from gpu_train.environment import Environment
        from remote.ssh import mux
        from remote.ssh.target import resolve

        target = resolve(Environment.from_os(self.env), "lost").for_node(0)
        mux.end_master(target, target.host)

    def cut_as_it_starts(
        self, node: int, start: Callable[[], subprocess.Popen[str]], gone: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """The task ``start`` starts, its link to ``node`` dropped while that host starts a run (its
        `screen -dmS` held), and with ``gone`` staying down: what the laptop said."""
        self.hold(node).touch()
        proc = start()
        try:
            deadline = time.monotonic() + 60
            while not self.hold(node).with_suffix(".reached").exists():
                assert proc.poll() is None and time.monotonic() < deadline, "the host never started a run"
                time.sleep(0.01)
            self.proxies[node].cut(stay_down=gone)
            (self.tmp / f"hold{node}.release").touch()
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def stop(self) -> None:
        for i in range(len(self.sshds)):
            (self.tmp / f"hold{i}.release").touch()  # (a failed test leaves no start waiting)
        for proxy in self.proxies:
            proxy.close()
        for sshd in self.sshds:
            sshd.stop()
        subprocess.run(["pkill", "-f", str(self.tmp)], check=False)


def first_run(hosts: Hosts) -> str:
    """A first run of `lost` on every node (the code sent), ended: the next train of it reuses its code."""
    run_fab(hosts.env, hosts.cwd, "status", check=True)  # first contact: the host keys are learned
    done = run_fab(hosts.env, hosts.cwd, "train", "--dir", str(hosts.code), "--command", "true", "--name", "lost", check=True)
    run = done.stdout.split()[1]
    for node in range(len(hosts.sshds)):
        assert hosts.ended(node, run) == "succeeded"
    after_the_second_of(run)
    return run


def cut_at_the_start(hosts: Hosts, node: int, *args: str, gone: bool = False, job: str = JOB) -> subprocess.CompletedProcess[str]:
    """A train of unchanged code whose link to ``node`` drops while that host starts the run (after its
    "ready (reused)", before its "launched"), and with ``gone`` stays down: what the laptop said."""
    return hosts.cut_as_it_starts(node, lambda: hosts.train(*args, job=job), gone)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("shared", "changed"),
    [(True, False), (False, False), (True, True)],
    ids=["reused, over the shared connection", "reused, over its own login", "sent, then told go"],
)
def test_a_run_started_as_its_link_dropped_is_reported_started_once(tmp_path: Path, shared: bool, changed: bool) -> None:
    hosts = Hosts(tmp_path, 1)
    try:
        first = first_run(hosts)
        if not shared:  # the train logs in itself (paramiko), as the first task after a minute does
            hosts.end_shared_connection()
        if changed:  # the code is sent, and the host goes on at the laptop's "go" (the same window, a round trip later)
            (hosts.code / "README").write_text("changed\n")
        said = cut_at_the_start(hosts, 0)
        assert said.returncode == 0, said.stderr
        run = said.stdout.split()[1]
        assert said.stdout.startswith(f"started {run} on "), said.stdout
        assert ("unchanged since the last run" in said.stderr) is not changed  # reused: the host went on by itself
        assert f"connecting again to ask whether {run} started" in said.stderr
        assert f"connected again: {run} had started" in said.stderr
        assert hosts.ended(0, run) == "succeeded" and "trained on 0" in (hosts.root(0) / "runs" / run / "log").read_text()
        assert hosts.runs(0) == sorted([first, run])  # one run started: the user was not sent to start it again
    finally:
        hosts.stop()


@pytest.mark.e2e
def test_a_host_that_cannot_be_asked_again_is_said_to_be_unknown_not_failed(tmp_path: Path) -> None:
    hosts = Hosts(tmp_path, 1)
    try:
        first_run(hosts)
        said = cut_at_the_start(hosts, 0, "--timeout", "2", gone=True)  # the link stays down
        assert said.returncode == ExitStatus.UNREACHABLE and not said.stdout, said.stderr
        run = said.stderr.split("ask whether ")[1].split()[0]
        assert f"{run} may be running there; `fab status --run {run}` says, `fab stop --run {run}` stops it" in said.stderr
        assert hosts.ended(0, run) == "succeeded"  # (it was: the message did not say it failed)
    finally:
        hosts.stop()


@pytest.mark.e2e
def test_a_cluster_whose_node_lost_its_link_as_it_started_runs_on_every_node(tmp_path: Path) -> None:
    hosts = Hosts(tmp_path, 2)
    try:
        first = first_run(hosts)
        said = cut_at_the_start(hosts, 1)  # node 0's link holds
        assert said.returncode == 0, said.stderr
        run = said.stdout.split()[1]
        assert said.stdout.startswith(f"started {run} on 2 nodes"), said.stdout
        assert f"connected again: {run} had started" in said.stderr
        for node in (0, 1):  # every node ran its part: none was stopped, none left running alone
            assert hosts.ended(node, run) == "succeeded", f"node {node}"
            assert f"trained on {node}" in (hosts.root(node) / "runs" / run / "log").read_text()
            assert hosts.runs(node) == sorted([first, run])
    finally:
        hosts.stop()


@pytest.mark.e2e
def test_a_cluster_node_that_cannot_be_asked_again_stops_the_others_and_is_named(tmp_path: Path) -> None:
    hosts = Hosts(tmp_path, 2)
    try:
        first_run(hosts)
        said = cut_at_the_start(hosts, 1, "--timeout", "2", gone=True, job="sleep 60")  # node 1's link stays down
        assert said.returncode == ExitStatus.UNREACHABLE and not said.stdout, said.stderr  # the one reason it failed
        run = said.stderr.split("ask whether ")[1].split()[0]
        assert f"node 1: the connection to {hosts.proxies[1].address[0]}" in said.stderr
        assert f"{run} may be running there; `fab status --run {run}` says" in said.stderr
        assert hosts.ended(0, run) == "stopped"  # no half a cluster where it can be helped: node 0 stopped
        # Node 1 could not be told (its link is down): its part runs on, as the message warned.
        deadline = time.monotonic() + 30
        while hosts.state(1, run) != "running":
            assert time.monotonic() < deadline and hosts.state(1, run) == "starting", hosts.state(1, run)
            time.sleep(0.05)
    finally:
        hosts.stop()


@pytest.mark.e2e
def test_a_cluster_none_of_whose_nodes_can_be_reached_exits_unreachable(tmp_path: Path) -> None:
    """Every node's failure is that it cannot be reached: the exit status says so (3), as one host's does,
    not the generic 1 of nodes failing for different reasons (gpu_train/errors.py shared_status)."""
    hosts = Hosts(tmp_path, 2, "127.0.45")  # (this test's own loopback addresses)
    try:
        for proxy in hosts.proxies:
            proxy.cut(stay_down=True)
        said = hosts.train("--timeout", "2")
        out, err = said.communicate(timeout=120)
        assert said.returncode == ExitStatus.UNREACHABLE and not out, err
        assert "node 0: " in err and "node 1: " in err and not (hosts.root(0) / "runs").exists()
    finally:
        hosts.stop()
