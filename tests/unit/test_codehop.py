"""Code sent once to a cluster (remote/transfer/codehop.py, agent/cluster.py).

End to end: three real sshds on 127.0.24.2-4 are the nodes, reached from the laptop through a
gateway sshd (ProxyJump) behind a byte-counting proxy, the laptop's uplink; the nodes reach each
other directly, as a cluster's own network. The laptop must send the code once, and every node
must hold the same code. A node whose sshd does not read the file the key was added to is sent
the code directly, with a notice. The pure parts (the request node 0 gets, the authorized_keys
line, appending it without touching what is there) are tables.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest

from agent import cluster
from agent.store import AgentError
from gpu_train.contract import TERMINAL
from gpu_train.stack.config import SshHost
from remote.errors import RemoteError
from remote.loopback import Sshd
from remote.ssh.target import Target
from remote.transfer import codehop
from tests.conftest import ROOT
from tests.unit.test_bucket_last_pass import AGENT_SHIM

sys.path.insert(0, str(ROOT / "bench"))

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# -- the pure parts ---------------------------------------------------------------------------


def _target(tmp: Path, peers: tuple[str, ...] = ()) -> Target:
    hosts = tuple(SshHost("me", f"203.0.113.{i}", 22, jump=(SshHost("me", "bastion", 22),)) for i in (1, 2, 3))
    return Target(
        stack="c",
        hosts=hosts,
        key_file="",
        known_hosts=tmp / "known_hosts",
        pinned=False,
        remote_root="~/gpu-train",
        python=None,
        venv=False,
        expect_gpus=0,
        hourly_cost_usd=None,
        is_gcp=bool(peers),
        cache=tmp,
        peer_addresses=peers,
    )


def test_nodes_reach_each_other_by_internal_address_when_there_is_one(tmp_path: Path) -> None:
    gcp, lab = _target(tmp_path, ("10.0.0.5", "10.0.0.6", "10.0.0.7")), _target(tmp_path)
    assert codehop.peer_host(gcp, 2) == SshHost("me", "10.0.0.7", 22)
    assert codehop.peer_host(lab, 2) == SshHost("me", "203.0.113.3", 22)  # never through the laptop's jump host
    assert codehop.authorize_args(gcp, "ssh-ed25519 AAAA", "r_1", "r")[-2:] == ["--from", "10.0.0.5"]
    assert "--from" not in codehop.authorize_args(lab, "ssh-ed25519 AAAA", "r_1", "r")


def test_the_request_for_node_0_pins_the_host_keys_the_laptop_learned(tmp_path: Path) -> None:
    gcp = _target(tmp_path, ("10.0.0.5", "10.0.0.6", "10.0.0.7"))
    learned = paramiko.Ed25519Key.from_private_key_file(str(Sshd(tmp_path / "s").host_key))
    (tmp_path / "known_hosts").write_text(f"203.0.113.2 ssh-ed25519 {learned.get_base64()}\n")
    private, public = codehop.new_key()
    assert public.startswith("ssh-ed25519 ") and codehop.new_key() != (private, public)  # one per train
    req = codehop.relay_request(gcp, "r_20250101_000000", "r", [1, 2], private)
    assert req["knownHosts"] == [f"gpu-train-node-1 ssh-ed25519 {learned.get_base64()}"]  # node 2: not known, none
    assert [n["dest"] for n in req["nodes"]] == [
        "me@10.0.0.6:gpu-train/staging/r_20250101_000000/",
        "me@10.0.0.7:gpu-train/staging/r_20250101_000000/",
    ]
    assert req["nodes"][0]["options"][1] == "--link-dest=../../code/r.last"
    # authorize checked the root; the receiving rsync leaves the node's own "go" once it has the tree
    assert req["nodes"][0]["options"][0] == (
        "--rsync-path=mkdir -p gpu-train/staging && sh -c 'rsync \"$@\" && : > gpu-train/staging/r_20250101_000000.arrived' rsync"
    )
    argv = cluster.hop_command("/h/gpu-train", "/tmp/hop", req["run"], req["nodes"][0])
    ssh = argv[argv.index("-e") + 1]
    assert "StrictHostKeyChecking=yes" in ssh and "HostKeyAlias=gpu-train-node-1" in ssh and "IdentitiesOnly=yes" in ssh
    assert argv[-2:] == ["/h/gpu-train/staging/r_20250101_000000/", "me@10.0.0.6:gpu-train/staging/r_20250101_000000/"]
    # The connection opened while the laptop still sends to node 0: the same options, no command.
    master = cluster.master_command("/tmp/x", req["nodes"][0], "/tmp/x/0")
    assert master[-2:] == ["-N", "me@10.0.0.6"] and "HostKeyAlias=gpu-train-node-1" in master
    assert (
        "ControlPath=/tmp/x/0"
        in cluster.hop_command("/h/gpu-train", "/tmp/x", req["run"], req["nodes"][0], "/tmp/x/0")[argv.index("-e") + 1]
    )
    assert "/tmp/hop/id_ed25519" in ssh and "UserKnownHostsFile=/tmp/hop/known_hosts" in ssh


@pytest.mark.parametrize(
    "key, name, source, words",
    [
        ("ssh-rsa AAAA", "c", None, "not an ssh-ed25519"),
        ("ssh-ed25519 AAAA\nssh-ed25519 BBBB", "c", None, "not an ssh-ed25519"),
        ('ssh-ed25519 AA"AA', "c", None, "not an ssh-ed25519"),
        ("ssh-ed25519 AAAA", "c d", None, "not a stack name"),
        ("ssh-ed25519 AAAA", "c", '10.0.0.1",command="sh', "not an address"),
    ],
)
def test_authorized_line_refuses_anything_but_a_plain_key(key, name, source, words) -> None:
    with pytest.raises(AgentError, match=words):
        cluster.authorized_line(key, name, source)


def test_authorize_binds_the_key_to_one_run_and_takes_it_away(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = tmp_path / "ssh" / "authorized_keys"
    monkeypatch.setenv("GPU_TRAIN_AUTHORIZED_KEYS", str(keys))
    assert cluster.cmd_authorize("ssh-ed25519 AAAA", "c", "10.0.0.5", "/r oot", "r_1", "r")["added"] is True
    line = keys.read_text()
    assert line.startswith('restrict,expiry-time="') and " ssh-ed25519 AAAA gpu-train-cluster:c\n" in line
    assert ',command="' + cluster.receive_command("/r oot", "r_1", "r") + '",from="10.0.0.5"' in line
    assert "receive-code --run r_1 --base r" in line
    assert keys.stat().st_mode & 0o777 == 0o600 and keys.parent.stat().st_mode & 0o777 == 0o700
    # the user's own line (no newline at the end) and an earlier version's permanent cluster line
    keys.write_text("ssh-ed25519 MINE me@laptop\nrestrict ssh-ed25519 OLD gpu-train-cluster:c")
    assert cluster.cmd_authorize("ssh-ed25519 AAAA", "c", None, "/r", "r_1", "r")["added"] is True
    assert cluster.cmd_authorize("ssh-ed25519 AAAA", "c", None, "/r", "r_1", "r")["added"] is False  # once
    lines = keys.read_text().splitlines()
    assert lines[0] == "ssh-ed25519 MINE me@laptop" and len(lines) == 2 and "OLD" not in keys.read_text()
    assert cluster.cmd_unauthorize("ssh-ed25519 AAAA")["removed"] is True
    assert keys.read_text() == "ssh-ed25519 MINE me@laptop\n"
    with pytest.raises(AgentError, match="--run and --base are required"):  # never a key for anything else
        cluster.cmd_authorize("ssh-ed25519 BBBB", "c", None, "/r")


@pytest.mark.parametrize(
    ("original", "ok"),
    [
        ("rsync --server -logDtpre.iLsfxCIvu --delete --link-dest=../../code/r.last . gpu-train/staging/r_1/", True),
        ("mkdir -p x && sh -c 'rsync \"$@\" && : > m' rsync --server -logDtpre.iLsfxCIvu . x", True),
        ("rsync --server --sender -logDtpre.iLsfxCIvu . /home/me/.ssh", False),  # sending: reading the node
        ("rsync --server -slogDtpre.iLsfxCIvu .", False),  # protected args: options the line does not show
        ("rsync --server -logDtpre.iLsfxCIvu --log-file=/home/me/.bashrc . x", True),  # (ours replace the rest)
        ("sh -i", False),
        ("", False),
    ],
)
def test_the_cluster_keys_command_only_receives_a_runs_code(original: str, ok: bool) -> None:
    if not ok:
        with pytest.raises(AgentError, match="only receives"):
            cluster.server_argv(original, "/r", "r_1", "r")
        return
    assert cluster.server_argv(original, "/r", "r_1", "r") == [
        "rsync",
        "--server",
        "-logDtpre.iLsfxCIvu",
        "--delete",
        "--link-dest=../../code/r.last",
        ".",
        "/r/staging/r_1/",
    ]


# -- a node's launch goes on the cluster's own word ----------------------------------------------
def _waiting_launch(root: Path, run: str, go_when: str | None, staged: bool = True, **more: object) -> subprocess.Popen:
    """The agent's `launch --await-go` as the laptop starts it, answered "ready" (the code staged)."""
    if staged:
        (root / "staging" / run).mkdir(parents=True)
        (root / "staging" / run / "train.py").write_text("print('hi')\n")
    spec = {"runId": run, "base": run.split("_")[0], "command": "true", "python": sys.executable, "goWhen": go_when, **more}
    agent = subprocess.Popen(
        [sys.executable, "-m", "agent", "--root", str(root), "launch", "-", "--await-go"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    agent.stdin.write(base64.b64encode(json.dumps(spec).encode()) + b"\n")
    agent.stdin.flush()
    assert json.loads(agent.stdout.readline())["ready"]
    return agent


@pytest.mark.parametrize(
    ("go_when", "marker", "said", "launched"),
    [
        ("arrived", "arrived", None, True),  # node i: the hop left the code; the laptop has said nothing
        ("relayed", "relayed", None, True),  # node 0: its relay ended
        ("arrived", None, b"go\n", True),  # the hop failed: the laptop pushed, then said go
        ("arrived", None, b"abort\n", False),  # ... and its push failed
        ("arrived", None, b"", False),  # the laptop went away
        ("arrived", "relayed", None, False),  # another node's word is not this one's
        (None, "arrived", None, False),  # a launch not in a fan-out takes the laptop's word only
    ],
)
def test_a_launch_goes_on_its_marker_or_the_laptops_word(tmp_path: Path, go_when, marker, said, launched) -> None:
    root, run = tmp_path / "root", "hop_20250101_000000"
    agent = _waiting_launch(root, run, go_when)
    if marker:
        (root / "staging" / f"{run}.{marker}").touch()
    if said is None and not launched:  # a marker that is not this launch's word: it still waits ...
        time.sleep(0.5)
        assert agent.poll() is None, agent.stdout.read()
        said = b""  # ... until the laptop goes away
    if said is not None:
        agent.stdin.write(said)
        agent.stdin.close()  # (after "go", as the laptop: nothing more comes)
    try:
        agent.wait(timeout=15 if said is None else 30)
    except subprocess.TimeoutExpired:
        agent.kill()
        raise AssertionError(f"the launch still waits ({go_when=}, {marker=})") from None
    finally:
        if not agent.stdin.closed:
            agent.stdin.close()
    out, err = agent.stdout.read(), agent.stderr.read()
    answer = json.loads(out.decode().splitlines()[-1]) if out.strip() else {}
    assert (answer.get("runId") == run) is launched, (out, err)
    assert (agent.returncode == 0) is launched, (agent.returncode, err)
    assert (root / "runs" / run / "code" / "train.py").exists() is launched
    log = (root / "agent.log").read_text() if (root / "agent.log").exists() else ""
    assert (f"{run}: launched on the fan-out's own word ({go_when})" in log) is (launched and said is None)
    if launched:
        assert not list((root / "staging").glob(f"{run}.*"))  # the marker went with the launch


def _first_run_ended(root: Path, run: str) -> None:
    """A first run of the code, launched and ended (its job run by the wrapper, as a host's would)."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "gpu-train-agent").write_text(AGENT_SHIM)  # where the wrapper finds the agent
    agent = _waiting_launch(root, run, None, codeManifest="m1")
    agent.communicate(b"go\n", timeout=30)
    state = root / "runs" / run / "state.json"
    deadline = time.monotonic() + 60
    while json.loads(state.read_text()).get("state") not in TERMINAL:
        assert time.monotonic() < deadline, f"{run} did not end: {state.read_text()}"
        time.sleep(0.05)


def test_a_launch_that_reused_the_code_goes_on_without_the_laptops_word(tmp_path: Path) -> None:
    """Unchanged code (train's common case): the host reuses the last run's copy and launches at once;
    the laptop has nothing to send, and waiting for its "go" would cost a round trip (issue 36)."""
    root, first, second = tmp_path / "root", "re_20250101_000000", "re_20250101_000001"
    _first_run_ended(root, first)
    spec = {"runId": second, "base": "re", "command": "true", "python": sys.executable, "codeManifest": "m1", "reuseCode": True}
    agent = subprocess.Popen(
        [sys.executable, "-m", "agent", "--root", str(root), "launch", "-", "--await-go"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert agent.stdin is not None and agent.stdout is not None
    agent.stdin.write(base64.b64encode(json.dumps(spec).encode()) + b"\n")
    agent.stdin.flush()  # ... and nothing more: the laptop's stdin stays open, as its channel does
    try:
        assert agent.wait(timeout=30) == 0  # (the old agent waited here for a "go" that never comes)
        ready, launched = agent.stdout.read().splitlines()
        assert json.loads(ready) == {"ready": True, "reused": True}
        assert json.loads(launched)["runId"] == second
    finally:
        agent.kill()
        agent.stdin.close()
    assert (root / "runs" / second / "code" / "train.py").read_text() == "print('hi')\n"


def test_a_launch_that_could_not_reuse_the_code_waits_for_it(tmp_path: Path) -> None:
    root, first, second = tmp_path / "root", "re_20250101_000000", "re_20250101_000001"
    _first_run_ended(root, first)
    agent = _waiting_launch(root, second, None, codeManifest="m2", reuseCode=True, staged=False)  # the code changed
    out, _ = agent.communicate(b"abort\n", timeout=30)  # the laptop's sync failed
    assert agent.returncode != 0 and not (root / "runs" / second).exists(), out


def test_a_node_that_fails_before_its_code_arrived_loses_the_key(tmp_path: Path) -> None:
    # The key is taken back on every path: the code arrived (node_sync), or the node's part ended first.
    fanout = codehop.CodeFanout(_target(tmp_path), "r_20250101_000000", "r")
    said: list[tuple[str, ...]] = []
    fanout.authorize(1, lambda *args: said.append(args) or {})
    fanout.authorize(2, lambda *args: said.append(args) or {})
    fanout.settle(1, "that node failed")
    assert said[-1] == ("unauthorize", "--key", fanout.public_key)
    fanout.settle(1, "that node failed")  # once
    assert [a[0] for a in said] == ["authorize", "authorize", "unauthorize"]
    fanout.settle(0, "node 0 failed")  # node 2 waits on node 0's code: it never comes, the key goes
    with pytest.raises(RemoteError):
        fanout.node_sync(2, lambda: None, lambda _: None)
    assert [a[0] for a in said].count("unauthorize") == 2
