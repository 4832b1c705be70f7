"""A cluster's code, sent once: node 0 passes the code it received on to the other nodes.

The laptop syncs the code to node 0 only (its uplink pays once, not once per node); node 0 then
rsyncs its staged copy to each other node over the nodes' own network (internal IPs on GCP), with
a key pair made on the laptop for each train. The private half comes to node 0 and lives only while
that train's hop runs (0600, in a 0700 folder of the hop's own, deleted after); the public half is in
the other nodes' authorized_keys only until the code arrived, bound to a forced command that receives
that run's code into its staging folder and nothing else (``receive-code``: no shell, no other path,
no sending), restricted (no forwarding, no pty; on GCP only from node 0's internal address), and
expiring within hours should nobody remove it. A process on node 0 that copies the key during the hop
gets a way to write one staging folder, for a while. Node 0 checks each node's host key against the key the
laptop learned for it (a known_hosts beside the key, under an alias per node), never accepting a new
one. No agent forwarding: a hostile node could use a forwarded agent to log in anywhere as you.

The laptop builds every rsync option that concerns the far node (its guard, its paths); this side
only adds its own staged folder and the key. Standard library only (it runs on the host).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from gpu_train.answers import Authorized, Hopped, Unauthorized
from gpu_train.atomic import atomic_write
from gpu_train.codec import answer
from gpu_train.contract import ARRIVED, AUTHORIZED_KEYS_ENV, RELAYED, STACK_NAME_PATTERN, go_marker, is_run_id

from .store import AgentError

KEY_TAG = "gpu-train-cluster"  # the comment of the authorized_keys line: `grep -v gpu-train-cluster` removes it
KEY_TYPES = ("ssh-ed25519",)
NAME_RE = re.compile(STACK_NAME_PATTERN)
FROM_RE = re.compile(r"[0-9A-Fa-f.:/]{2,64}")  # an IP address or CIDR
ALIAS_RE = re.compile(r"gpu-train-node-[0-9]{1,4}")
KEY_LIFE_S = 2 * 3600  # a cluster key no one removed (the laptop gone mid-hop) stops working after this
# The receiving rsync's own flags as a client's `rsync -a --delete` sends them: archive letters, then
# "e." and the client's capabilities. No 's' (protected args would bring options the command line does
# not show), no --sender.
SERVER_FLAGS_RE = re.compile(r"-[logDtpr]+e\.[A-Za-z]*")
# OpenSSH as the hop runs it: only our key, only our pinned host keys, never a prompt.
CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com"


def authorized_keys_path() -> str:
    """Where this host's sshd reads the login user's keys: ~/.ssh/authorized_keys, unless the
    session says otherwise (GPU_TRAIN_AUTHORIZED_KEYS: an sshd with its own AuthorizedKeysFile)."""
    return os.environ.get(AUTHORIZED_KEYS_ENV) or os.path.expanduser("~/.ssh/authorized_keys")


def authorized_line(key: str, name: str, source: str | None, command: str | None = None, expires: float | None = None) -> str:
    """The authorized_keys line for a cluster key, each part checked (it ends up in a file sshd reads).
    ``command``: the forced command (its characters are ours, quoted here); ``expires``: a time (epoch s)."""
    parts = key.split()
    if len(parts) != 2 or parts[0] not in KEY_TYPES or not re.fullmatch(r"[A-Za-z0-9+/]+={0,2}", parts[1]):
        raise AgentError("the cluster key is not an ssh-ed25519 public key")
    if not NAME_RE.fullmatch(name):
        raise AgentError("the cluster's stack name is not a stack name")
    if source and not FROM_RE.fullmatch(source):
        raise AgentError("the cluster key's from= is not an address")
    if command is not None and re.search(r"[\x00-\x1f\x7f]", command):
        raise AgentError("the cluster key's command has control characters")
    options = "restrict"
    if expires is not None:
        options += f',expiry-time="{time.strftime("%Y%m%d%H%M", time.localtime(expires))}"'  # sshd reads local time
    if command is not None:
        options += ',command="' + command.replace('"', '\\"') + '"'  # sshd unescapes \" only
    options += f',from="{source}"' if source else ""
    return f"{options} {parts[0]} {parts[1]} {KEY_TAG}:{name}"


def receive_command(root: str, run: str, base: str) -> str:
    """The forced command of a train's cluster key: this agent's receive-code for that run only."""
    if not is_run_id(run) or not is_run_id(base):  # a base follows the same rule
        raise AgentError("authorize: not a run id or base name")
    agent = os.path.join(root, "bin", "gpu-train-agent")
    return shlex.join([sys.executable, "-I", "-S", agent, "--root", root, "receive-code", "--run", run, "--base", base])


def _rewrite_keys(path: str, change: Callable[[str], str]) -> tuple[str, str]:
    """``change(old text) -> new text`` on authorized_keys, under a lock, written whole (a reader sees the
    old or the new file; a symbolic link is followed, its file rewritten); (old, new)."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    real = os.path.realpath(path)
    with open(os.path.join(os.path.dirname(path), ".gpu-train-keys.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(real, "rb") as f:
                old = f.read().decode("utf-8", "surrogateescape")
                mode = os.fstat(f.fileno()).st_mode & 0o777
        except FileNotFoundError:
            old, mode = "", 0o600
        new = change(old)
        if new != old:
            atomic_write(real, new, mode & 0o600 or 0o600, keep_mode=False)
        return old, new


def _ours(line: str) -> bool:
    return f" {KEY_TAG}:" in line


def _stale(line: str) -> bool:
    """A cluster line of ours that must go: an earlier version's permanent one (no forced command)."""
    return _ours(line) and "command=" not in line.split(" ssh-")[0]


def cmd_authorize(key: str, name: str, source: str | None, root: str = "", run: str | None = None, base: str | None = None) -> Authorized:
    """Add a train's cluster key to authorized_keys, bound to receiving ``run``'s code (``receive-code``)
    and expiring; earlier versions' permanent cluster lines are taken out on the way."""
    if run is None or base is None:  # never a key that logs in for anything else
        raise AgentError("authorize: the key is bound to one run's code: --run and --base are required")
    command = receive_command(root, run, base)
    line = authorized_line(key, name, source, command, time.time() + KEY_LIFE_S)
    blob = key.split()[1]
    path = authorized_keys_path()

    def add(old: str) -> str:
        lines = [ln for ln in old.splitlines() if not _stale(ln)]
        if not any(blob in existing.split() for existing in lines):
            lines.append(line)
        return "".join(f"{ln}\n" for ln in lines) if lines != old.splitlines() else old

    try:
        old, new = _rewrite_keys(path, add)
    except OSError as e:
        raise AgentError(f"cannot add the cluster key to {path}: {e.strerror}") from None
    return answer(Authorized, authorized=path, added=line in new.splitlines() and line not in old.splitlines())


def cmd_unauthorize(key: str) -> Unauthorized:
    """Take a train's cluster key out of authorized_keys (the code arrived, or will not)."""
    parts = key.split()
    if len(parts) != 2 or not re.fullmatch(r"[A-Za-z0-9+/]+={0,2}", parts[1]):
        raise AgentError("the cluster key is not an ssh-ed25519 public key")
    path = authorized_keys_path()

    def drop(old: str) -> str:
        lines = old.splitlines()
        keep = [ln for ln in lines if not (_ours(ln) and parts[1] in ln.split())]
        return "".join(f"{ln}\n" for ln in keep) if keep != lines else old

    try:
        old, new = _rewrite_keys(path, drop)
    except OSError as e:
        raise AgentError(f"cannot remove the cluster key from {path}: {e.strerror}") from None
    return answer(Unauthorized, authorized=path, removed=old != new)


def server_argv(original: str, root: str, run: str, base: str) -> list[str]:
    """The receiving rsync a cluster key may run: the flags of the command node 0 asked for
    (``original``, SSH_ORIGINAL_COMMAND) if they are a plain receive, and everything else ours."""
    try:
        words = shlex.split(original)
    except ValueError:
        words = []
    at = words.index("--server") if "--server" in words else -1
    flags = words[at + 1] if 0 <= at < len(words) - 1 else ""
    if at < 0 or "--sender" in words or not SERVER_FLAGS_RE.fullmatch(flags):
        raise AgentError(f"receive-code: this key only receives a run's code, not {original[:200]!r}")
    if not is_run_id(run) or not is_run_id(base):  # a base follows the same rule
        raise AgentError("receive-code: not a run id or base name")
    return ["rsync", "--server", flags, "--delete", f"--link-dest=../../code/{base}.last", ".", os.path.join(root, "staging", run) + "/"]


def cmd_receive_code(root: str, run: str, base: str) -> int:
    """The forced command of a cluster key: receive ``run``'s code into its staging folder, then leave
    RUN.arrived (the node's own "go"). stdin and stdout stay rsync's."""
    argv = server_argv(os.environ.get("SSH_ORIGINAL_COMMAND", ""), root, run, base)
    os.makedirs(os.path.join(root, "staging"), exist_ok=True)
    code = subprocess.run(argv).returncode
    if code == 0:
        open(go_marker(root, run, ARRIVED), "w").close()
    return code


def _write_private(path: str, text: str) -> None:
    """Write ``text`` to a new file ``path`` (mode 0600) in this hop's own new folder."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w") as f:
        f.write(text)


def ssh_options(folder: str, node: dict[str, Any]) -> list[str]:
    """OpenSSH options for the hop to one node: the cluster key only, its pinned host key only
    (under the node's alias), never a prompt. ``folder`` holds this hop's key and pins."""
    if not isinstance(node.get("alias"), str) or not ALIAS_RE.fullmatch(node["alias"]):
        raise AgentError("relay-code: bad host key alias")
    return [
        "-i",
        os.path.join(folder, "id_ed25519"),
        "-p",
        str(int(node["port"])),
        "-F",
        "/dev/null",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        f"UserKnownHostsFile={os.path.join(folder, 'known_hosts')}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"HostKeyAlias={node['alias']}",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "ServerAliveInterval=5",
        "-o",
        "ServerAliveCountMax=3",
        "-o",
        f"Ciphers={CIPHERS}",
    ]


def master_command(folder: str, node: dict[str, Any], control: str) -> list[str]:
    """An SSH connection to the node opened while the laptop still sends the code to node 0: the
    rsync after it then costs no key exchange and no login (ssh -N: no command, no shell)."""
    return ["ssh", *ssh_options(folder, node), "-o", "ControlMaster=yes", "-o", f"ControlPath={control}", "-N", str(node["login"])]


def hop_command(root: str, folder: str, run: str, node: dict[str, Any], control: str | None = None) -> list[str]:
    """The rsync that sends node 0's staged code for ``run`` to one other node (over the node's open
    connection when ``control`` names one that is up; otherwise ssh connects anew)."""
    mux = ["-o", "ControlMaster=no", "-o", f"ControlPath={control}"] if control else []
    ssh = shlex.join(["ssh", *ssh_options(folder, node), *mux])
    # No --protect-args: the far side's forced command reads the flags from its command line (receive-code)
    return [
        "rsync",
        "-a",
        "--delete",
        "-e",
        ssh,
        *[str(o) for o in node["options"]],
        os.path.join(root, "staging", run) + "/",
        str(node["dest"]),
    ]


def cmd_relay_code(root: str, doc: dict[str, Any]) -> int:
    """On node 0: write the cluster's key and pinned host keys, connect to each node of
    ``doc["nodes"]``, and on "go" (the laptop's sync to node 0 is done) rsync the staged code of
    ``doc["run"]`` to them all at once, printing one JSON line per node as it finishes ({"node": i}
    or {"node": i, "error": why}), so each node goes on as soon as it has the code. Each node's rsync
    leaves RUN.arrived there, and node 0 gets RUN.relayed once every hop ended: the launches waiting
    on those nodes go on at once, not a long-link trip later (contract.GO_WHEN)."""
    run = doc.get("run")
    if not is_run_id(run):
        raise AgentError("relay-code: not a run id")
    if not isinstance(doc.get("key"), str) or not all(isinstance(x, str) and "\n" not in x for x in doc.get("knownHosts") or [0]):
        raise AgentError("relay-code: no key or no pinned host keys in the request")
    nodes = doc.get("nodes") or []
    # This hop's own folder (0700; short: a socket's path has ~100 bytes at most) for the key, the pins
    # and the connections: the key is at rest on node 0 only while the hop runs, and two trains of
    # stacks sharing node 0's REMOTE_ROOT never overwrite each other's key or pins.
    folder = tempfile.mkdtemp(prefix="gpu-train-hop-")
    shutil.rmtree(os.path.join(root, "cluster"), ignore_errors=True)  # where earlier versions kept the key for good
    masters = []
    try:
        _write_private(os.path.join(folder, "id_ed25519"), doc["key"])
        _write_private(os.path.join(folder, "known_hosts"), "".join(f"{line}\n" for line in doc["knownHosts"]))
        for i, node in enumerate(nodes):
            with contextlib.suppress(OSError, AgentError, KeyError, ValueError):  # the rsync says why, later
                masters.append(
                    subprocess.Popen(
                        master_command(folder, node, os.path.join(folder, str(i))),
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        if sys.stdin.readline().strip() != "go":
            return 0  # the laptop's sync failed or it went away: nothing to pass on
        source = os.path.join(root, "staging", run)
        if not os.path.isdir(source):
            raise AgentError(f"relay-code: no staged code at {source}")
        _hop_all(root, folder, run, nodes)
        # Node 0's launch may go now (its staged folder, the hops' source, is free to move).
        open(go_marker(root, run, RELAYED), "w").close()
    finally:
        for master in masters:
            master.terminate()
        for master in masters:
            with contextlib.suppress(subprocess.TimeoutExpired):
                master.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def _hop_all(root: str, folder: str, run: str, nodes: list[dict[str, Any]]) -> None:
    lock = threading.Lock()

    def hop(i: int, node: dict[str, Any]) -> None:
        error = None
        try:
            done = subprocess.run(
                hop_command(root, folder, run, node, os.path.join(folder, str(i))),
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=3600,
            )
            if done.returncode != 0:
                # ssh's own words ("Permission denied (publickey)", "Connection refused") say more
                # than rsync's "connection unexpectedly closed" after them.
                lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
                said = [ln for ln in lines if not ln.startswith("rsync")] or lines[-1:]
                error = f"{' '.join(said[-2:])[-400:] or 'no message'} (rsync exit {done.returncode})"
        except (OSError, subprocess.SubprocessError, AgentError, KeyError, ValueError) as e:
            error = str(e) or type(e).__name__
        hopped = answer(Hopped, node=node.get("node"), **({"error": error} if error is not None else {}))
        with lock:
            print(json.dumps(hopped), flush=True)

    threads = [threading.Thread(target=hop, args=(i, n)) for i, n in enumerate(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def read_doc() -> dict[str, Any]:
    """The request on stdin's first line, base64 JSON (the private key never on a command line)."""
    try:
        doc = json.loads(base64.b64decode(sys.stdin.readline()))
    except ValueError:
        raise AgentError("relay-code: the request is not base64 JSON") from None
    if not isinstance(doc, dict):
        raise AgentError("relay-code: the request is not a JSON object")
    return doc
