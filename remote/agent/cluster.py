"""A cluster's code, sent once: node 0 passes the code it received on to the other nodes.

The laptop syncs the code to node 0 only (its uplink pays once, not once per node); node 0 then
rsyncs its staged copy to each other node over the nodes' own network (internal IPs on GCP), with
a key pair made for the cluster on the laptop. The private half comes to node 0 with each train and
lives only while that train's hop runs (0600, in a 0700 folder of the hop's own, deleted after); the
public half is in the other nodes' authorized_keys, restricted (no forwarding of any kind, no pty; on
GCP only from node 0's internal address). Node 0 checks each node's host key against the key the
laptop learned for it (a known_hosts beside the key, under an alias per node), never accepting a new
one. No agent forwarding: a hostile node could use a forwarded agent to log in anywhere as you.

The laptop builds every rsync option that concerns the far node (its guard, its paths); this side
only adds its own staged folder and the key. Standard library only (it runs on the host).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading

from .protocol import RELAYED, go_marker
from .store import AgentError

KEY_TAG = "gpu-train-cluster"  # the comment of the authorized_keys line: `grep -v gpu-train-cluster` removes it
KEY_TYPES = ("ssh-ed25519",)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")  # a stack name (Pulumi's rule)
FROM_RE = re.compile(r"[0-9A-Fa-f.:/]{2,64}")  # an IP address or CIDR
RUN_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
ALIAS_RE = re.compile(r"gpu-train-node-[0-9]{1,4}")
# OpenSSH as the hop runs it: only our key, only our pinned host keys, never a prompt.
CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com"


def authorized_keys_path() -> str:
    """Where this host's sshd reads the login user's keys: ~/.ssh/authorized_keys, unless the
    session says otherwise (GPU_TRAIN_AUTHORIZED_KEYS: an sshd with its own AuthorizedKeysFile)."""
    return os.environ.get("GPU_TRAIN_AUTHORIZED_KEYS") or os.path.expanduser("~/.ssh/authorized_keys")


def authorized_line(key: str, name: str, source: str | None) -> str:
    """The authorized_keys line for a cluster key, each part checked (it ends up in a file sshd reads)."""
    parts = key.split()
    if len(parts) != 2 or parts[0] not in KEY_TYPES or not re.fullmatch(r"[A-Za-z0-9+/]+={0,2}", parts[1]):
        raise AgentError("the cluster key is not an ssh-ed25519 public key")
    if not NAME_RE.fullmatch(name):
        raise AgentError("the cluster's stack name is not a stack name")
    options = "restrict" + (f',from="{source}"' if source else "")
    if source and not FROM_RE.fullmatch(source):
        raise AgentError("the cluster key's from= is not an address")
    return f"{options} {parts[0]} {parts[1]} {KEY_TAG}:{name}"


def cmd_authorize(key: str, name: str, source: str | None) -> dict:
    """Add the cluster's public key to authorized_keys once (appended: nothing there is rewritten)."""
    line = authorized_line(key, name, source)
    path = authorized_keys_path()
    blob = key.split()[1]
    try:
        with open(path, "rb") as f:
            old = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        old = ""
    except OSError as e:
        raise AgentError(f"cannot read {path}: {e.strerror}") from None
    if any(blob in existing.split() for existing in old.splitlines()):
        return {"authorized": path, "added": False}
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(("\n" if old and not old.endswith("\n") else "") + line + "\n")
    except OSError as e:
        raise AgentError(f"cannot add the cluster key to {path}: {e.strerror}") from None
    return {"authorized": path, "added": True}


def _write_private(path: str, text: str) -> None:
    """Write ``text`` to a new file ``path`` (mode 0600) in this hop's own new folder."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w") as f:
        f.write(text)


def ssh_options(folder: str, node: dict) -> list[str]:
    """OpenSSH options for the hop to one node: the cluster key only, its pinned host key only
    (under the node's alias), never a prompt. ``folder`` holds this hop's key and pins."""
    if not isinstance(node.get("alias"), str) or not ALIAS_RE.fullmatch(node["alias"]):
        raise AgentError("relay-code: bad host key alias")
    return ["-i", os.path.join(folder, "id_ed25519"), "-p", str(int(node["port"])), "-F", "/dev/null",
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={os.path.join(folder, 'known_hosts')}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
            "-o", f"HostKeyAlias={node['alias']}", "-o", "ConnectTimeout=10",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", f"Ciphers={CIPHERS}"]


def master_command(folder: str, node: dict, control: str) -> list[str]:
    """An SSH connection to the node opened while the laptop still sends the code to node 0: the
    rsync after it then costs no key exchange and no login (ssh -N: no command, no shell)."""
    return ["ssh", *ssh_options(folder, node), "-o", "ControlMaster=yes", "-o", f"ControlPath={control}", "-N",
            str(node["login"])]


def hop_command(root: str, folder: str, run: str, node: dict, control: str | None = None) -> list[str]:
    """The rsync that sends node 0's staged code for ``run`` to one other node (over the node's open
    connection when ``control`` names one that is up; otherwise ssh connects anew)."""
    mux = ["-o", "ControlMaster=no", "-o", f"ControlPath={control}"] if control else []
    ssh = shlex.join(["ssh", *ssh_options(folder, node), *mux])
    return ["rsync", "-a", "--delete", "--protect-args", "-e", ssh, *[str(o) for o in node["options"]],
            os.path.join(root, "staging", run) + "/", str(node["dest"])]


def cmd_relay_code(root: str, doc: dict) -> int:
    """On node 0: write the cluster's key and pinned host keys, connect to each node of
    ``doc["nodes"]``, and on "go" (the laptop's sync to node 0 is done) rsync the staged code of
    ``doc["run"]`` to them all at once, printing one JSON line per node as it finishes ({"node": i}
    or {"node": i, "error": why}), so each node goes on as soon as it has the code. Each node's rsync
    leaves RUN.arrived there, and node 0 gets RUN.relayed once every hop ended: the launches waiting
    on those nodes go on at once, not a long-link trip later (protocol.GO_WHEN)."""
    run = doc.get("run")
    if not isinstance(run, str) or not RUN_RE.fullmatch(run):
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
                masters.append(subprocess.Popen(master_command(folder, node, os.path.join(folder, str(i))),
                                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL))
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


def _hop_all(root: str, folder: str, run: str, nodes: list[dict]) -> None:
    lock = threading.Lock()

    def hop(i: int, node: dict) -> None:
        answer: dict = {"node": node.get("node")}
        try:
            done = subprocess.run(hop_command(root, folder, run, node, os.path.join(folder, str(i))), capture_output=True,
                                  text=True, stdin=subprocess.DEVNULL, timeout=3600)
            if done.returncode != 0:
                # ssh's own words ("Permission denied (publickey)", "Connection refused") say more
                # than rsync's "connection unexpectedly closed" after them.
                lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
                said = [ln for ln in lines if not ln.startswith("rsync")] or lines[-1:]
                answer["error"] = f"{' '.join(said[-2:])[-400:] or 'no message'} (rsync exit {done.returncode})"
        except (OSError, subprocess.SubprocessError, AgentError, KeyError, ValueError) as e:
            answer["error"] = str(e) or type(e).__name__
        with lock:
            print(json.dumps(answer), flush=True)

    threads = [threading.Thread(target=hop, args=(i, n)) for i, n in enumerate(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def read_doc() -> dict:
    """The request on stdin's first line, base64 JSON (the private key never on a command line)."""
    try:
        return json.loads(base64.b64decode(sys.stdin.readline()))
    except ValueError:
        raise AgentError("relay-code: the request is not base64 JSON") from None
