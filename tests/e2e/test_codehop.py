"""The e2e tier of tests/unit/test_codehop.py (the same subject; its helpers are there)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote.loopback import Sshd
from remote.transfer import codehop
from tests.conftest import ROOT, cluster_stack, fab_env, run_fab

sys.path.insert(0, str(ROOT / "bench"))
from delayproxy import DelayProxy

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


NET = "127.0.24"


MiB = 1 << 20


def tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()}


class Trio:
    """Three nodes behind a gateway; ``sealed``: node numbers whose sshd reads keys from a file the
    agent is not told about (an sshd with an AuthorizedKeysCommand, say): the hop to them fails."""

    def __init__(self, tmp: Path, sealed: tuple[int, ...] = (), count: int = 3, net: str = NET):
        self.tmp = tmp
        self.gateway = Sshd(tmp / "gw", f"{net}.1").start()
        key = self.gateway.client_key
        self.nodes = []
        for i in range(count):
            elsewhere = f"GPU_TRAIN_AUTHORIZED_KEYS={tmp}/unread_keys{i} " if i in sealed else ""
            (tmp / f"hoptmp{i}").mkdir(mode=0o700)  # the node's temporary folder: where a hop keeps its key
            self.nodes.append(Sshd(tmp / f"n{i}", f"{net}.{i + 2}", client_key=key, setenv=f"{elsewhere}TMPDIR={tmp}/hoptmp{i}").start())
        self.uplink = DelayProxy((f"{net}.11", 0), (self.gateway.address, self.gateway.port), 0.0).start()
        config = tmp / "ssh_config"
        config.write_text(
            f"Host gw\n  HostName {net}.11\n  Port {self.uplink.address[1]}\n  IdentityFile {key}\n"
            + "".join(f"Host n{i}\n  HostName {s.address}\n  Port {s.port}\n  ProxyJump gw\n" for i, s in enumerate(self.nodes))
        )
        cluster_stack(tmp / "stacks", "trio", [f"n{i}" for i in range(count)], key, f"  gpu-train:sshConfig: {config}\n")
        self.cwd = tmp / "work"
        self.cwd.mkdir()
        self.code = tmp / "code"
        self.code.mkdir()
        for i in range(4):  # incompressible: what crosses the uplink is what was sent
            (self.code / f"weights{i}.bin").write_bytes(os.urandom(MiB))
        (self.code / "train.py").write_text("print('hello')\n")
        self.env = fab_env(tmp / "stacks", tmp / "home", "trio", self.cwd)

    def fab(self, *args: str) -> subprocess.CompletedProcess:
        return run_fab(self.env, self.cwd, *args, check=True, timeout=300)

    def train(self, name: str) -> tuple[str, subprocess.CompletedProcess, int]:
        """(run id, the fab result, bytes the laptop sent on its uplink meanwhile)."""
        before = self.uplink.bytes_up
        r = self.fab("train", "--dir", str(self.code), "--command", "python train.py", "--name", name)
        return r.stdout.split()[1], r, self.uplink.bytes_up - before

    def stop(self) -> None:
        for s in (self.gateway, *self.nodes):
            s.stop()
        self.uplink.close()


@pytest.fixture
def trio(tmp_path: Path, request: pytest.FixtureRequest):
    t = Trio(tmp_path, getattr(request, "param", ()))
    yield t
    t.stop()


def test_the_laptop_sends_the_code_once_and_every_node_has_it(trio: Trio) -> None:
    trio.fab("status")  # first contact: the host keys are learned (as any first task does)
    legacy = trio.tmp / "node0" / "cluster" / "id_ed25519"  # where earlier versions left the key for good
    legacy.parent.mkdir(parents=True)
    legacy.write_text("an old cluster key")
    hoptmp = trio.tmp / "hoptmp0"
    os.utime(hoptmp, (1, 1))
    run, result, sent = trio.train("hop")
    code = 4 * MiB
    assert code <= sent < 1.5 * code, f"the laptop sent {sent / MiB:.1f} MiB for {code / MiB:.0f} MiB of code to 3 nodes"
    assert "could not come from node 0" not in result.stderr
    expected = tree_digest(trio.code)
    for i in range(3):
        assert tree_digest(trio.tmp / f"node{i}" / "runs" / run / "code") == expected, f"node {i}"
    # Each node went on the cluster's own word, not a long-link trip later: node 0 once its relay had
    # ended, the others once the hop had left them the whole tree. No marker is left behind.
    for i, when in enumerate(("relayed", "arrived", "arrived")):
        assert [line.endswith(f"({when}), not the laptop's") for line in launched_how(trio, i, run)] == [True], f"node {i}"
        assert not list((trio.tmp / f"node{i}" / "staging").glob(f"{run}.*"))
    # Node 0 kept neither the cluster's private key nor the pins once the hop was done: the hop's folder
    # in its temporary directory was made (the folder's time moved) and is gone; an old key at rest too.
    assert hoptmp.stat().st_mtime > 1 and list(hoptmp.iterdir()) == []
    assert not (trio.tmp / "node0" / "cluster").exists()
    # The other nodes let that train's key in only until the code arrived (a copy taken on node 0
    # during the hop was a shell on every node for good, issue 28 H); node 0 never did.
    for i in range(3):
        assert "gpu-train-cluster" not in (trio.tmp / f"n{i}" / "authorized_keys").read_text(), f"node {i}"

    # Unchanged code is not sent at all, to any node.
    run2, _, sent2 = trio.train("hop")
    assert sent2 < code / 4, f"{sent2 / MiB:.1f} MiB sent for unchanged code"
    for i in range(3):
        assert tree_digest(trio.tmp / f"node{i}" / "runs" / run2 / "code") == expected

    # Changed code goes through node 0 again, and only the change crosses the uplink.
    (trio.code / "train.py").write_text("print('changed')\n")
    run3, result3, sent3 = trio.train("hop")
    assert sent3 < code / 4 and "could not come from node 0" not in result3.stderr
    for i in range(3):
        assert (trio.tmp / f"node{i}" / "runs" / run3 / "code" / "train.py").read_text() == "print('changed')\n"


def test_a_copied_cluster_key_opens_no_shell_and_reads_nothing(trio: Trio, tmp_path: Path) -> None:
    # What a process on node 0 holding a copy of the key could do while it is authorized.
    trio.fab("status")  # the agents are installed on every node
    node, root = trio.nodes[1], trio.tmp / "node1"
    private, public = codehop.new_key()
    key = tmp_path / "stolen"
    key.write_text(private)
    key.chmod(0o600)
    env = {**os.environ, "GPU_TRAIN_AUTHORIZED_KEYS": str(node.dir / "authorized_keys"), "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            "--root",
            str(root),
            "authorize",
            "--key",
            public,
            "--name",
            "trio",
            "--run",
            "hop_20260101_000000",
            "--base",
            "hop",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    ssh = [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        str(key),
        "-p",
        str(node.port),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        f"{node.user}@{node.address}",
    ]
    shell = subprocess.run([*ssh, "id"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert "uid=" not in shell.stdout and shell.returncode != 0 and "only receives a run's code" in shell.stdout
    secret = root / "agent.json"
    read = subprocess.run(
        ["rsync", "-e", shlex.join(ssh[:-1]), f"{ssh[-1]}:{secret}", str(tmp_path / "got")], capture_output=True, text=True, timeout=30
    )
    assert read.returncode != 0 and not (tmp_path / "got").exists()
    subprocess.run(
        [sys.executable, "-m", "agent", "--root", str(root), "unauthorize", "--key", public],
        env=env,
        check=True,
        capture_output=True,
    )
    gone = subprocess.run([*ssh, "id"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert "Permission denied" in gone.stderr


@pytest.mark.parametrize("trio", [(2,)], indirect=True)
def test_a_node_the_hop_cannot_reach_gets_the_code_from_the_laptop(trio: Trio) -> None:
    trio.fab("status")
    run, result, sent = trio.train("fallback")
    notices = [line for line in result.stderr.splitlines() if "could not come from node 0" in line]
    assert len(notices) == 1 and notices[0].startswith("node 2: ") and "sending it from here" in notices[0], result.stderr
    assert "Permission denied" in notices[0]
    assert 2 * 4 * MiB <= sent < 2.5 * 4 * MiB  # node 0 and node 2 from the laptop, node 1 from node 0
    expected = tree_digest(trio.code)
    for i in range(3):
        assert tree_digest(trio.tmp / f"node{i}" / "runs" / run / "code") == expected, f"node {i}"
    # Node 2 had no code from node 0, so no marker: it went on the laptop's "go", after the laptop's push.
    assert launched_how(trio, 2, run) == [] and launched_how(trio, 1, run)


@pytest.mark.e2e
def test_a_cluster_sweep_sends_its_code_once_and_each_node_runs_its_trial(tmp_path: Path) -> None:
    """A sweep over two nodes sends the code over the laptop's link once, as `train` does (node 0 passes
    it on), and each node runs its trial from it. Loopback 127.0.43.x."""
    duo = Trio(tmp_path, count=2, net="127.0.43")
    try:
        for i in range(4):  # the project is the sweep's code: incompressible, so what crosses is what was sent
            (duo.cwd / f"weights{i}.bin").write_bytes(os.urandom(MiB))
        (duo.cwd / "train.py").write_text("import sys\nprint('trial', *sys.argv[1:])\n")
        duo.fab("status")  # first contact: the host keys are learned
        before = duo.uplink.bytes_up
        result = duo.fab("sweep", "--script", "train.py", "--name", "sw", "--slots", "1", "--values", "x=1,2")
        sent, code = duo.uplink.bytes_up - before, 4 * MiB
        assert "sw: 2 trials over 2 slot(s); started 2" in result.stdout, result.stdout
        assert code <= sent < 1.5 * code, f"the laptop sent {sent / MiB:.1f} MiB for {code / MiB:.0f} MiB of code to 2 nodes"
        assert "to 2 nodes (once: node 0 passes it on)" in result.stderr and "could not come from node 0" not in result.stderr
        expected = tree_digest(duo.cwd)
        for node in (0, 1):
            root = tmp_path / f"node{node}"
            (run,) = [p.name for p in (root / "runs").glob(f"sw_t{node}_x{node + 1}_*")]
            deadline = time.monotonic() + 60
            while json.loads((root / "runs" / run / "state.json").read_text())["state"] != "succeeded":
                assert time.monotonic() < deadline, f"node {node}: {run} did not succeed"
                time.sleep(0.05)
            assert f"trial --x {node + 1}" in (root / "runs" / run / "log").read_text()
            assert tree_digest(root / "sweeps" / "sw" / "code") == expected, f"node {node}"
            assert not list((root / "staging").glob("*")), f"node {node}: left in staging"  # no code, no go marker
    finally:
        duo.stop()


def launched_how(trio: Trio, node: int, run: str) -> list[str]:
    """Node ``node``'s agent log lines on how ``run``'s launch went on without the laptop's "go"."""
    log = (trio.tmp / f"node{node}" / "agent.log").read_text() if (trio.tmp / f"node{node}" / "agent.log").exists() else ""
    return [line for line in log.splitlines() if f"{run}: launched on the fan-out's own word" in line]


@pytest.mark.e2e
def test_a_node_that_went_on_its_own_word_counts_as_started_when_the_laptops_push_fails(tmp_path: Path) -> None:
    """The hop reached node i (its marker), so its launch went on; then the laptop's own push there
    failed (or Ctrl-C came): the node runs, and the laptop must count it as started (to stop it with
    the others, or say it runs), not as failed and forgotten. The laptop's launch over a real sshd."""
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.stack.stackfile import load_stack
    from remote.ssh import agentcall
    from remote.ssh import connect as ssh
    from remote.ssh.target import target_from

    sshd = Sshd(tmp_path / "sshd", f"{NET}.20").start()
    try:
        root = tmp_path / "remote"
        sshd.stack_file(tmp_path / "stacks", "node", root, sys.executable)
        target = target_from(load_stack("node", load_catalog(), [tmp_path / "stacks"], "gpu-train"), None, tmp_path / "state")
        run = "hop_20250101_000000"
        (root / "staging" / run).mkdir(parents=True)
        (root / "staging" / run / "train.py").write_text("print('hi')\n")
        spec = {"runId": run, "base": "hop", "command": "true", "python": sys.executable, "goWhen": "arrived"}

        def push_that_fails() -> None:
            (root / "staging" / f"{run}.arrived").touch()  # node 0's hop got there first
            deadline = time.monotonic() + 30
            while not (root / "runs" / run / "code").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            raise RuntimeError("the laptop's push failed")

        conn = ssh.open_connection(target, target.host, 10, lambda _: None)
        try:
            answer = agentcall.launch(conn, target, base64.b64encode(json.dumps(spec).encode()).decode(), push_that_fails)
        finally:
            conn.close()
        assert answer["runId"] == run and (root / "runs" / run / "code" / "train.py").exists()
    finally:
        sshd.stop()
