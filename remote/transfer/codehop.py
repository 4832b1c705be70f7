"""Code sent once to a cluster: the laptop syncs node 0, node 0 passes the code on to the others.

A laptop's uplink is often the slowest link of all; syncing each node from it pays N times. Here
the laptop syncs node 0 only, and node 0 rsyncs its staged copy to the other nodes over their own
network (GCP: internal IPs; SSH stacks: the hosts' addresses) while each node runs its launch
checks. The hop uses a key pair made for the cluster (agent/cluster.py says where each half
lives and why not agent forwarding), and node 0 checks each node's host key against the one this
laptop learned. A node the hop cannot reach (a firewall, an sshd that reads keys elsewhere) gets
the code straight from the laptop, with a one-line notice: the hop saves time, it never fails a run.

The decisions (the request node 0 gets, the pinned host keys, where nodes reach each other) are
plain functions; CodeFanout only sequences them across the nodes' threads.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any

from agent.bundle import agent_command
from gpu_train.contract import ARRIVED, RELAYED, go_marker
from gpu_train.errors import printable_doc
from gpu_train.stack.sshhost import SshHost
from remote.errors import RemoteError
from remote.ssh.agentcall import LINE_MAX
from remote.ssh.mux import channel_errors
from remote.ssh.openssh import host_id
from remote.ssh.target import Target
from remote.transfer.sync import staging_dest, staging_options

if TYPE_CHECKING:
    import paramiko

KEY_NAME = "cluster_ed25519"  # where earlier versions kept one key per stack for good: removed


def alias(node: int) -> str:
    """The name node 0's known_hosts pins node ``node``'s key under (ssh -o HostKeyAlias)."""
    return f"gpu-train-node-{node}"


def peer_host(cluster: Target, node: int) -> SshHost:
    """Node ``node`` as node 0 reaches it: its internal address on GCP (port 22), else its address
    here; never through this laptop's jump hosts (node 0 sits on the nodes' own network)."""
    host = cluster.hosts[node]
    if cluster.peer_addresses:
        return dataclasses.replace(host, host=cluster.peer_addresses[node], port=22, jump=())
    return dataclasses.replace(host, jump=())


def pinned_lines(cluster: Target, node: int) -> list[str]:
    """known_hosts lines for node 0: the host keys this laptop holds for ``node``, under its alias."""
    if not cluster.known_hosts.is_file():
        return []
    import paramiko  # (loaded only here and by logins: mux.channel_errors)

    keys = paramiko.HostKeys(str(cluster.known_hosts)).lookup(host_id(cluster.hosts[node])) or {}
    return [f"{alias(node)} {kind} {keys[kind].get_base64()}" for kind in sorted(keys.keys())]


def relay_request(cluster: Target, run: str, base: str, nodes: list[int], private_key: str) -> dict[str, Any]:
    """What node 0's agent gets (on stdin) to pass the staged code of ``run`` on to ``nodes``. Their
    REMOTE_ROOTs were checked by the `authorize` call that comes first: the rsync does not again."""
    entries = []
    for i in nodes:
        target, peer = cluster.for_node(i), peer_host(cluster, i)
        arrived = go_marker(target.rsync_root(), run, ARRIVED)  # the node's own "go" (see GO_WHEN)
        entries.append(
            {
                "node": i,
                "alias": alias(i),
                "port": peer.port,
                "options": staging_options(target, base, guard=False, marker=arrived),
                "login": f"{peer.user}@{peer.host}",
                "dest": staging_dest(target, peer, run),
            }
        )
    pinned = [line for i in nodes for line in pinned_lines(cluster, i)]
    return {"run": run, "key": private_key, "knownHosts": pinned, "nodes": entries}


def authorize_args(cluster: Target, public_key: str, run: str, base: str) -> list[str]:
    """The agent's `authorize` for a node other than 0: the key may only receive ``run``'s code there
    (its forced command); on GCP it works from node 0's internal address only (the hop comes from
    there); SSH stacks cannot know what address node 0 comes from."""
    source = cluster.peer_addresses[0] if cluster.peer_addresses else None
    return [
        "authorize",
        "--key",
        public_key,
        "--name",
        cluster.stack,
        "--run",
        run,
        "--base",
        base,
        *(["--from", source] if source else []),
    ]


def new_key() -> tuple[str, str]:
    """(private key in OpenSSH format, public key line): a key pair for one train, never stored here.
    A copy taken on node 0 during the hop dies with the hop: the nodes forget it once the code is there."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private.decode(), public.decode()


class CodeFanout:
    """One `train` on several nodes: the laptop syncs node 0, node 0 passes the code on.

    Each node's thread calls in: node 0's sync is ``node0_sync`` (the laptop's push, then the hop
    to every node that authorized the key, before node 0's own launch goes ahead: its staged folder
    is the source); node i's is ``node_sync`` (wait for the hop; on failure, the laptop's push).
    Every future is settled on every path (``settle``), so no node waits forever on a failed one.
    """

    def __init__(self, cluster: Target, run: str, base: str):
        self.cluster, self.run, self.base = cluster, run, base
        self.private_key, self.public_key = new_key()
        with contextlib.suppress(OSError):
            (cluster.cache / KEY_NAME).unlink()
        self.calls: dict[int, Callable[..., dict[str, Any]]] = {}  # each node's agent call, to take the key away again
        others = range(1, len(cluster.hosts))
        self.authorized: dict[int, Future[str | None]] = {i: Future() for i in others}  # result: None, or why not
        self.arrived: dict[int, Future[str | None]] = {i: Future() for i in others}  # None: the code is there; or why not

    @staticmethod
    def go_when(node: int) -> str:
        """What the node's launch also takes as "go" (contract.GO_WHEN): node 0 goes on once its relay
        has ended (its staged folder is the hops' source), node i once node 0's hop has left it the code."""
        return RELAYED if node == 0 else ARRIVED

    def authorize(self, node: int, call: Callable[..., dict[str, Any]]) -> None:
        """Node ``node``'s thread, once connected: let the cluster key in. Never raises."""
        try:
            self.calls[node] = call
            call(*authorize_args(self.cluster, self.public_key, self.run, self.base))
            _settle(self.authorized[node], None)
        except Exception as e:  # (a task's error too) the node gets the code directly
            _settle(self.authorized[node], f"the cluster key could not be authorized there: {_message(e)}")

    def settle(self, node: int, why: str) -> None:
        """Node ``node``'s thread is done or failed: nothing may wait on it any longer."""
        if node in self.authorized:
            _settle(self.authorized[node], why)
            self.revoke(node)  # a node that failed before its code arrived: its key goes too
        if node == 0:
            for f in self.arrived.values():
                _settle(f, error=RemoteError(f"the code did not reach node 0 ({why})"))

    def node0_sync(self, push: Callable[[], None], open_channel: Callable[[], paramiko.Channel]) -> None:
        """The laptop's push to node 0, while node 0 gets ready to pass the code on (its agent started,
        connections to the other nodes opened as soon as they let the key in); then the hop."""
        relay = _Relay(self, open_channel)
        preparing = threading.Thread(target=relay.prepare, daemon=True)
        preparing.start()
        try:
            push()
        except BaseException as e:
            self.settle(0, _message(e))
            preparing.join()
            relay.close()
            raise
        preparing.join()
        relay.go()

    def node_sync(self, node: int, push: Callable[[], None], say: Callable[[str], None]) -> None:
        try:
            why = self.arrived[node].result()  # raises when node 0 never got the code
        finally:
            self.revoke(node)
        if why is None:
            return
        say(f"node {node}: the code could not come from node 0 ({why}); sending it from here")
        push()

    def revoke(self, node: int) -> None:
        """Take the train's key out of node ``node``'s authorized_keys (its expiry covers a failure here)."""
        call = self.calls.pop(node, None)  # once per node
        if call is not None and self.authorized[node].done():
            with contextlib.suppress(Exception):
                call("unauthorize", "--key", self.public_key)


class _Relay:
    """Node 0's `relay-code` agent for one fan-out: started during the laptop's push, released by "go"."""

    def __init__(self, fanout: CodeFanout, open_channel: Callable[[], paramiko.Channel]):
        self.fanout, self.open_channel = fanout, open_channel
        self.nodes: list[int] = []
        self.chan: paramiko.Channel | None = None
        self.fallback = "node 0 did not answer"

    def prepare(self) -> None:
        """Wait for each node's word on the key; start node 0's agent for those that let it in."""
        fanout = self.fanout
        for i, f in fanout.authorized.items():
            why = f.result()
            if why is None and not pinned_lines(fanout.cluster, i):
                why = "its host key is not known here"
            if why is None:
                self.nodes.append(i)
            else:
                _settle(fanout.arrived[i], why)
        if not self.nodes:
            return
        request = relay_request(fanout.cluster, fanout.run, fanout.base, self.nodes, fanout.private_key)
        try:
            chan = self.open_channel()
            chan.exec_command(agent_command(fanout.cluster.for_node(0).remote_root, "relay-code", cli=fanout.cluster.cli))
            chan.sendall(base64.b64encode(json.dumps(request).encode()) + b"\n")
            self.chan = chan
        except channel_errors() as e:
            self.fallback = f"node 0: {_message(e)}"

    def go(self) -> None:
        """The code is on node 0: pass it on, settling each node's future as node 0 reports it."""
        arrived = self.fanout.arrived
        try:
            if self.chan is not None:
                self.chan.sendall(b"go\n")
                answers = self.chan.makefile("rb")
                for line in iter(lambda: answers.readline(LINE_MAX), b""):  # node 0's lines, bounded
                    try:
                        said = printable_doc(json.loads(line))
                    except ValueError:
                        continue
                    if "node" in said and said["node"] in arrived:
                        _settle(arrived[said["node"]], said.get("error") and f"node 0 could not reach it: {said['error']}")
                    elif "error" in said:
                        self.fallback = f"node 0 refused: {said['error']}"
        except channel_errors() as e:
            self.fallback = f"node 0: {_message(e)}"
        finally:
            self.close()
        for i in self.nodes:
            _settle(arrived[i], self.fallback)

    def close(self) -> None:
        if self.chan is not None:
            self.chan.close()


def _settle(future: Future[str | None], result: str | None = None, error: BaseException | None = None) -> None:
    """Settle ``future`` unless another thread did first (the first word stands)."""
    with contextlib.suppress(InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _message(e: BaseException) -> str:
    text = str(getattr(e, "message", "") or e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__
