"""Pools end to end: a GCP stack of chief, worker and parameter-server pools, its nodes being three
real sshds on loopback, each in a mount namespace of its own (as each VM has its own disk). `fab
train --command` starts the job on every node with TF_CONFIG roles taken from the pools.

What cannot run here stands in at the outermost boundary only: the stack's outputs are what the
program exports for this stack (read from the cache that `pulumi stack output` fills), and
`nvidia-smi -L` lists the GPUs the pools give each node (there is no GPU on this machine).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import program
from infra.ops import preview
from remote.loopback import Sshd
from tests.conftest import FAB, ROOT

# Both tests take port 22 of the same addresses: one worker runs them, one after the other.
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.xdist_group("pools_e2e")]

ADDRESSES = ["127.0.17.2", "127.0.17.3", "127.0.17.4"]
POOLS = [
    {"role": "chief", "machineType": "n1-standard-8", "gpuType": "nvidia-tesla-t4", "gpuCount": 1},
    {"role": "worker", "machineType": "n1-standard-8", "gpuType": "nvidia-tesla-t4", "gpuCount": 1},
    {"role": "ps", "machineType": "n1-highmem-8"},
]
FAKE_SMI = """#!/bin/sh
# nvidia-smi as a T4 VM answers: the GPU list, and a utilisation query.
case "$*" in
  *-L*) for i in $(seq 0 $(($GPUS - 1))); do echo "GPU $i: Tesla T4 (UUID: GPU-0000000$i)"; done ;;
  *--query-gpu*) for i in $(seq 0 $(($GPUS - 1))); do echo "$i, 0, 0, 15360"; done ;;
esac
"""


def usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a mount namespace per node, sshd on port 22 of loopback addresses)"
    if not shutil.which("unshare"):
        return "needs unshare (util-linux)"
    return None


def start_on_22(server: Sshd) -> Sshd:
    """Start it (a GCP stack's nodes listen on port 22); while port 22 of its address is still another
    server's (the test before in this group letting it go), try again for 10 s, then skip naming the holder."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return server.start()
        except RuntimeError as e:
            if "Address already in use" not in str(e):
                raise
            if time.monotonic() > deadline:
                holders = subprocess.run(["ss", "-Htanp", "sport = :22"], capture_output=True, text=True).stdout
                pytest.skip(f"port 22 of {server.address} stayed taken: {holders.strip()[:600]!r}")
        time.sleep(0.2)


@pytest.fixture
def pool_cluster(tmp_path: Path, public_key: Path):
    if (why := usable()) is not None:
        pytest.skip(why)
    mount = tmp_path / "disk"  # REMOTE_ROOT on every node; each node mounts its own folder there
    mount.mkdir()
    nodes, sshds = [], []
    try:
        key = public_key.with_suffix("")
        for i, (address, pool_gpus) in enumerate(zip(ADDRESSES, [1, 1, 0], strict=True)):
            disk, fakebin = tmp_path / f"node{i}", tmp_path / f"bin{i}"
            disk.mkdir()
            fakebin.mkdir()
            (fakebin / "nvidia-smi").write_text(FAKE_SMI)
            (fakebin / "nvidia-smi").chmod(0o755)
            prefix = ("unshare", "--mount", "--propagation", "private", "sh", "-c", f'mount --bind "{disk}" "{mount}" && exec "$0" "$@"')
            env = f"PATH={fakebin}:/usr/local/bin:/usr/bin:/bin GPUS={pool_gpus}"
            sshds.append(start_on_22(Sshd(tmp_path / f"sshd{i}", address, client_key=key, port=22, setenv=env, prefix=prefix)))
            nodes.append(disk)
        stacks, home = tmp_path / "stacks", tmp_path / "home"
        stacks.mkdir()
        raw = {
            "gcp:project": "proj-1",
            "gpu-train:zone": "us-central1-a",
            "gpu-train:sshSourceRanges": ["203.0.113.7/32"],
            "gpu-train:sshPublicKey": str(public_key),
            "gpu-train:remoteRoot": str(mount),
            "gpu-train:python": sys.executable,
            "gpu-train:idleStopMinutes": 0,
            "gpu-train:pools": POOLS,
        }
        (stacks / "Pulumi.pools.yaml").write_text(json.dumps({"config": raw}))
        # The outputs `pulumi up` exports for this stack: the program's own, with the nodes' real addresses.
        declared = preview.run(program.main, stack="pools", config=raw)
        assert declared.error is None, declared.error
        # (The loopback nodes log in as this test's user rather than the VM's `trainer`.)
        outputs = {
            **declared.outputs,
            "externalIps": ADDRESSES,
            "internalIps": ADDRESSES,
            "externalIp": ADDRESSES[0],
            "internalIp": ADDRESSES[0],
            "sshUser": getpass.getuser(),
        }
        assert (outputs["nodeRoles"], outputs["nodeGpuCounts"]) == (["chief", "worker", "ps"], [1, 1, 0])
        (home / "pools").mkdir(parents=True)
        (home / "pools" / "outputs.json").write_text(json.dumps(outputs))
        env = {
            **os.environ,
            "GPU_TRAIN_STACKS_DIR": str(stacks),
            "GPU_TRAIN_HOME": str(home),
            "GPU_TRAIN_STACK": "pools",
            "PYTHONPATH": str(ROOT),
        }
        yield nodes, env, tmp_path
    finally:  # also when setting up failed half way
        for s in sshds:
            s.stop()
        subprocess.run(["pkill", "-f", str(tmp_path)], check=False)


def fab(env: dict, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [FAB, "--search-root", str(ROOT), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )


def test_tf_config_roles_come_from_the_pools(pool_cluster) -> None:
    nodes, env, tmp = pool_cluster
    code = tmp / "code"
    code.mkdir()
    (code / "show.py").write_text("import json, os\nprint('TF_CONFIG=' + os.environ['TF_CONFIG'])\n")
    out = fab(env, code, "train", "--dir", str(code), "--command", "python3 show.py", "--name", "tfcfg")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "on 3 nodes" in out.stdout
    run = out.stdout.split("started ", 1)[1].split()[0]
    deadline, configs = time.monotonic() + 60, {}
    while time.monotonic() < deadline and len(configs) < 3:
        for i, disk in enumerate(nodes):
            log = disk / "runs" / run / "log"
            text = log.read_text() if log.exists() else ""
            if "TF_CONFIG=" in text:
                configs[i] = json.loads(text.split("TF_CONFIG=", 1)[1].splitlines()[0])
        time.sleep(0.5)
    assert len(configs) == 3, f"TF_CONFIG seen on nodes {sorted(configs)}"
    cluster = {"chief": [f"{ADDRESSES[0]}:2222"], "worker": [f"{ADDRESSES[1]}:2222"], "ps": [f"{ADDRESSES[2]}:2222"]}
    assert all(c["cluster"] == cluster for c in configs.values())
    assert [configs[i]["task"] for i in range(3)] == [
        {"type": "chief", "index": 0},
        {"type": "worker", "index": 0},
        {"type": "ps", "index": 0},
    ]
    status = fab(env, code, "status", "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    (mine,) = [r for r in doc["runs"] if r["id"] == run]
    assert mine["state"] in ("succeeded", "running"), mine


def test_torchrun_on_a_cpu_only_pool_is_refused_before_anything_runs(pool_cluster) -> None:
    nodes, env, tmp = pool_cluster
    code = tmp / "code"
    code.mkdir()
    (code / "train.py").write_text("print('ran')\n")
    out = fab(env, code, "train", "--dir", str(code), "--script", "train.py")
    assert out.returncode == 2 and "ps pool" in out.stderr and "--command" in out.stderr
    assert not any((disk / "runs").exists() for disk in nodes)  # nothing was sent or started
