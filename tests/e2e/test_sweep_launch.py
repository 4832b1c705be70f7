"""A sweep's trials are started as `train` starts a run (remote/tasks/launching.py): the stack's settings a
`train` honours hold for every trial. Real sshd, the real agent and uploader, a real Cloud Storage
emulator and a webhook receiver on loopback. Before the sweep shared train's launch path, every trial
uploaded into one prefix (the sweep's placeholder run id: each trial's files over another's) and each trial's
launch removed the host's webhook, so neither the trials nor a run already training were announced.
Loopback 127.0.38.2 (sshd) and 127.0.38.3 (webhook)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, Lab
from tests.gcs import Emulator, area
from tests.unit.test_glance_tasks import env, gcp  # noqa: F401 (fixtures: the t4 stack, the Compute API's stand-in)
from tests.webhook import Webhook

LAB_ADDRESS = "127.0.38.2"
pytestmark = pytest.mark.e2e
TRIAL = "import os, sys\nopen(os.path.join(os.environ['JOB_DIR'], 'value.txt'), 'w').write(sys.argv[-1])\nprint('trial', sys.argv[-1])\n"
WAITS = 'while [ ! -e "$JOB_DIR/release" ]; do sleep 0.05; done; echo released'


@pytest.fixture
def stacked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The lab stack with gpu-train:bucket (the emulator) and gpu-train:notify (the webhook)."""
    emu = Emulator("ckpt", tmp_path / "emulator.log")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.url)  # the laptop's side
    hook = Webhook("127.0.38.3")
    lab = Lab(tmp_path, LAB_ADDRESS, setenv=f"STORAGE_EMULATOR_HOST={emu.url}")  # the host's login sessions
    stack = lab.stacks / "Pulumi.lab.yaml"
    stack.write_text(stack.read_text() + f"  gpu-train:bucket: gs://ckpt/team\n  gpu-train:notify: {hook.url}\n")
    yield lab, emu, hook
    lab.sshd.stop()
    hook.close()
    emu.stop()
    subprocess.run(["pkill", "-f", str(lab.remote)], check=False)


def _ended(lab: Lab, run: str) -> bool:
    path = lab.remote / "runs" / run / "state.json"
    return path.exists() and json.loads(path.read_text()).get("state") == "succeeded"


def _wait(what: str, ready, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := ready():
            return got
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout:g} s")


def test_each_trial_has_its_own_place_in_the_bucket_and_every_end_is_announced(stacked) -> None:
    lab, emu, hook = stacked
    (lab.cwd / "trial.py").write_text(TRIAL)
    subprocess.run(["git", "init", "-q"], cwd=lab.cwd, check=True)
    waiting = lab.train("--command", WAITS, "--name", "long")  # a run at work before the sweep starts
    out = lab.fab("sweep", "--script", "trial.py", "--name", "pair", "--slots", "2", "--values", "v=a,b", check=True).stdout
    assert "pair: 2 trials over 2 slot(s); started 2" in out, out
    trials = sorted(p.name for p in (lab.remote / "runs").glob("pair_t*"))
    assert [t.split("_20")[0] for t in trials] == ["pair_t0_va", "pair_t1_vb"]
    for run in trials:
        _wait(f"{run}'s end", lambda run=run: _ended(lab, run))

    # Each trial's JOB_DIR uploaded under its own run id, as a `train` run's is.
    for run, value in zip(trials, "ab", strict=True):
        prefix = f"team/.gpu-train-runs/{area(lab.stacks / 'Pulumi.lab.yaml')}/{run}/"
        got = _wait(f"{run}'s upload", lambda prefix=prefix: (o := emu.objects(prefix)).get(f"{prefix}value.txt") and o)
        assert got[f"{prefix}value.txt"] == value.encode(), sorted(got)
        assert lab.run_state(run)["bucket"]["url"] == f"gs://ckpt/{prefix}"
    staged = "pair" + trials[0][-16:]  # the sweep's name and its trials' stamp (_YYYYmmdd_HHMMSS): no run's place
    assert emu.objects(f"team/.gpu-train-runs/{area(lab.stacks / 'Pulumi.lab.yaml')}/{staged}/") == {}

    # Every end announced: each trial's, and the run that was training when the sweep started.
    for run in trials:
        assert "succeeded" in hook.wait_for(run)
    (lab.remote / "runs" / waiting / "job" / "release").write_text("")
    assert "succeeded" in hook.wait_for(waiting)
    record = (lab.remote / "sweeps" / "pair" / "sweep.json").read_text()
    assert hook.url not in record and json.loads(record)["job"].get("notify") is None  # the secret kept as a run's: notify.url only


NVIDIA_SMI = """#!/bin/sh
# nvidia-smi before and after the driver is installed: no GPU until {ready} exists, then one T4
[ -e {ready} ] || exit 9
case "$1" in
  -L) echo "GPU 0: Tesla T4 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  --query-gpu=*) echo "0, Tesla T4, 0, 0, 15360" ;;
esac
"""


def test_a_sweep_on_a_fresh_vm_waits_for_the_driver_as_train_does(env: dict, gcp, tmp_path: Path) -> None:
    """A GCP stack's VM on its first boot lists no GPU until its NVIDIA driver is installed: `train` waits
    for it, and so does a sweep now (before, its trials started at once, with no GPU to see). The 'VM' is a
    real sshd on 127.0.38.5:22 (GCP stacks log in on port 22) with an nvidia-smi that lists a GPU once told."""
    import socket
    import sys

    from remote.loopback import Sshd
    from tests.unit.test_glance_tasks import FAB, T4

    try:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.38.5", 22))
    except OSError:
        pytest.skip("port 22 on 127.0.38.5 is taken (or this user may not bind it)")
    ready, fakebin = tmp_path / "driver-installed", tmp_path / "fakebin"
    fakebin.mkdir()
    (fakebin / "nvidia-smi").write_text(NVIDIA_SMI.format(ready=ready))
    (fakebin / "nvidia-smi").chmod(0o755)
    sshd = Sshd(tmp_path / "vm", "127.0.38.5", setenv=f"PATH={fakebin}:{Path(sys.executable).parent}:/usr/bin:/bin")
    sshd.port = 22
    sshd.start()
    try:
        (tmp_path / "stacks" / "Pulumi.t4.yaml").write_text(
            T4.format(key=f"{sshd.client_key}.pub") + f"  gpu-train:remoteRoot: {tmp_path / 'vmroot'}\n"
        )
        outputs = json.loads((tmp_path / "state" / "t4" / "outputs.json").read_text())
        (tmp_path / "state" / "t4" / "outputs.json").write_text(json.dumps({**outputs, "externalIp": "127.0.38.5", "sshUser": sshd.user}))
        project = tmp_path / "proj"
        project.mkdir()
        subprocess.run(["git", "init", "-q"], cwd=project, check=True)
        (project / "job.py").write_text(
            "import os, sys\nopen(os.path.join(os.environ['JOB_DIR'], 'cuda'), 'w').write(os.environ.get('CUDA_VISIBLE_DEVICES', '-'))\n"
        )
        runs = tmp_path / "vmroot" / "runs"

        def waits_for_the_driver(name: str, *args: str) -> str:
            """The task's output once it said it waits for the driver, nothing started meanwhile, and the driver came."""
            task = subprocess.Popen(
                [FAB, "--search-root", str(ROOT), *args, "--name", name, "--stack", "t4"],
                env=env,
                cwd=project,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                stdin=subprocess.DEVNULL,
            )
            said = []
            while "waiting for NVIDIA driver: 0/1 GPUs visible to nvidia-smi" not in (line := task.stderr.readline()):
                assert line, f"{args[0]} did not wait for the driver: {''.join(said)}{task.communicate(timeout=60)}"
                said.append(line)
            assert not list(runs.glob(f"{name}_*")) and not (tmp_path / "vmroot" / "sweeps").exists()  # nothing started, nothing kept
            ready.write_text("")
            out, err = task.communicate(timeout=120)
            assert task.returncode == 0, err
            ready.unlink()
            return out

        (first,) = runs.glob(waits_for_the_driver("first", "train", "--script", "job.py").split()[1])
        out = waits_for_the_driver("drv", "sweep", "--script", "job.py", "--values", "v=1")
        assert "drv: 1 trials over 1 slot(s); started 1" in out, out
        (trial,) = runs.glob("drv_t0_v1_*")
        for run, cuda in ((first, "-"), (trial, "0")):  # a run sees every GPU; a trial its slot's
            _wait(f"{run.name}'s job", lambda run=run: (run / "job" / "cuda").exists())
            assert (run / "job" / "cuda").read_text() == cuda
    finally:
        sshd.stop()
        subprocess.run(["pkill", "-f", str(tmp_path / "vmroot")], check=False)
