"""`gpu-train` from a researcher's own project, outside this repository, against real sshds.

The project is a git repo in a temporary directory with a gitignored data/; HOME is a temporary
directory too, so nothing of the user's own ssh setup is read or written. A passphrase key goes
through a real ssh-agent; a jump host is a second sshd. This suite's loopback addresses are 127.0.14.x.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote.loopback import Sshd, free_port
from tests.pyindex import OFFLINE_INDEX

GPU_TRAIN = str(Path(sys.executable).parent / "gpu-train")
SCRUB = ("GPU_TRAIN_STACKS_DIR", "GPU_TRAIN_HOME", "GPU_TRAIN_STACK", "GPU_TRAIN_PROJECT", "SSH_AUTH_SOCK", "PYTHONPATH")

HELLO = "import sys\nprint('hello from the job in', sys.prefix)\n"
CRASH = "print('loading', flush=True)\nprint(len(open('data/train.csv', 'rb').read()), 'bytes of data')\n"
USES_DATA = "import os\nprint('DATA_DIR has', sorted(os.listdir(os.environ['DATA_DIR'])))\n"


class Project:
    """A researcher's project directory and a way to run `gpu-train` in it."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.dir = tmp / "my-model"
        self.home = tmp / "home"
        self.remote = tmp / "remote"
        self.dir.mkdir()
        self.home.mkdir()
        self.agent_sock: str | None = None
        for name, text in {
            ".gitignore": "data/\n__pycache__/\n",
            "hello.py": HELLO,
            "crash.py": CRASH,
            "uses_data.py": USES_DATA,
            "requirements.txt": "# nothing yet\n",
        }.items():
            (self.dir / name).write_text(text)
        (self.dir / "data").mkdir()
        (self.dir / "data" / "train.csv").write_bytes(b"x" * (3 * 1024 * 1024))
        subprocess.run(["git", "init", "-q"], cwd=self.dir, check=True)

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in SCRUB}
        env["HOME"] = str(self.home)
        if self.agent_sock:
            env["SSH_AUTH_SOCK"] = self.agent_sock
        return env

    def run(self, *args: str, check: bool = False, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [GPU_TRAIN, *args], cwd=cwd or self.dir, env=self.env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        assert "Traceback" not in result.stderr, result.stderr
        if check and result.returncode != 0:
            raise AssertionError(f"gpu-train {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def stack(self, name: str, lines: str) -> Path:
        path = self.dir / "stacks" / f"Pulumi.{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text("config:\n  gpu-train:target: ssh\n" + lines)
        return path


@pytest.fixture
def proj(tmp_path: Path):
    p = Project(tmp_path)
    yield p
    subprocess.run(["pkill", "-f", str(p.remote)], check=False)  # jobs left running by a failed test


@pytest.fixture
def sshd(tmp_path: Path):
    servers: list[Sshd] = []

    def start(address: str, client_key: Path | None = None) -> Sshd:
        server = Sshd(tmp_path / f"sshd-{address}", address, client_key, setenv=f"PIP_INDEX_URL={OFFLINE_INDEX}").start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def started_run(result: subprocess.CompletedProcess) -> str:
    return result.stdout.split()[1]  # "started RUN_ID on ..."


def test_refused_and_unresolvable_hosts_fail_at_once(proj: Project) -> None:
    key = proj.tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    started = time.monotonic()
    proj.run("--version", check=True)
    baseline = time.monotonic() - started  # starting Python and Fabric, on a busy machine
    port = free_port("127.0.14.5")
    for host, words in (
        (f"root@127.0.14.5:{port}", f"connection refused by 127.0.14.5:{port}"),
        ("root@gpu-box.invalid", "cannot resolve the host name 'gpu-box.invalid'"),
    ):
        proj.stack("lab", f"  gpu-train:hosts: ['{host}']\n  gpu-train:sshKey: {key}\n")
        started = time.monotonic()
        result = proj.run("status")
        elapsed = time.monotonic() - started
        assert result.returncode == 3 and words in result.stderr
        assert elapsed - baseline < 2.0, (elapsed, baseline)


def test_ssh_without_a_remainder_task_is_an_error(proj: Project) -> None:
    result = proj.run("status", "--", "ls")
    assert result.returncode == 2 and "gpu-train ssh -- nvidia-smi" in result.stderr


def test_fab_in_the_repo_keeps_working() -> None:
    from tests.conftest import ROOT

    result = subprocess.run([str(Path(sys.executable).parent / "fab"), "-l"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0 and "train" in result.stdout and "init" in result.stdout


# -- a GCP stack whose VM stopped itself ---------------------------------------------------------
@pytest.mark.parametrize(
    ("inst", "words"),
    [
        ({"status": "RUNNING"}, None),
        ({"status": "PROVISIONING"}, None),
        ({"status": "TERMINATED", "lastStopTimestamp": "2026-11-22T05:00:00+00:00"}, "is TERMINATED, stopped 2 h ago"),
        ({"status": "SUSPENDED"}, "gcloud compute instances resume vm-0"),
    ],
)
def test_stopped_message(inst: dict, words: str | None) -> None:
    from datetime import datetime

    from remote.ssh import vmprobe

    vm = {"project": "p", "zone": "us-central1-a", "name": "vm-0", "spot": True, "idleStopMinutes": 30}
    now = datetime.fromisoformat("2026-11-22T07:10:00+00:00").timestamp()
    text = vmprobe.stopped_message(inst, "t4", vm, now)
    if words is None:
        assert text is None
    else:
        assert words in text and "idle auto-stop after 30 idle min or a spot preemption" in text


def test_a_stopped_vm_is_said_at_once(proj: Project, tmp_path: Path, public_key: Path) -> None:
    import json

    from tests.google_fake import FakeGoogle

    google = FakeGoogle("127.0.14.7")
    try:
        now = time.time()
        from datetime import datetime, timezone

        google.state["instances"]["proj-1"] = [
            {
                "name": "gpu-train-t4",
                "zone": "https://www.googleapis.com/compute/v1/projects/proj-1/zones/us-central1-a",
                "status": "TERMINATED",
                "lastStopTimestamp": datetime.fromtimestamp(now - 7300, timezone.utc).isoformat(),
            }
        ]
        (proj.dir / "stacks").mkdir()
        (proj.dir / "stacks" / "Pulumi.t4.yaml").write_text(
            "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-central1-a\n  gpu-train:gpuType: nvidia-tesla-t4\n"
            f"  gpu-train:gpuCount: 1\n  gpu-train:spot: true\n  gpu-train:sshSourceRanges: [203.0.113.7/32]\n"
            f"  gpu-train:sshPublicKey: {public_key}\n"
        )
        from gpu_train.stack.project import state_folder

        state = state_folder(proj.home / ".local" / "state" / "gpu-train", proj.dir) / "t4"  # the user's records
        state.mkdir(parents=True)
        (state / "outputs.json").write_text(
            json.dumps(
                {  # the VM's last known address: nothing listens there now
                    "externalIp": "127.0.14.6",
                    "internalIp": "10.0.0.2",
                    "sshUser": "trainer",
                    "instanceName": "gpu-train-t4",
                    "zone": "us-central1-a",
                    "gpuCount": 1,
                }
            )
        )
        adc = google.adc_file(tmp_path / "adc.json")
        env = {"GOOGLE_APPLICATION_CREDENTIALS": str(adc), "GPU_TRAIN_COMPUTE_ENDPOINT": google.url}
        started = time.monotonic()
        result = subprocess.run(
            [GPU_TRAIN, "status"],
            cwd=proj.dir,
            env={**proj.env, **env},
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 3, result.stderr
        assert "the VM gpu-train-t4 is TERMINATED, stopped 2 h ago" in result.stderr
        assert "gcloud compute instances start gpu-train-t4 --zone us-central1-a --project proj-1" in result.stderr
        assert time.monotonic() - started < 30  # not the 600 s SSH wait
    finally:
        google.close()


# -- the user's install -----------------------------------------------------------------------------
def test_user_install_is_lean_and_links_the_command(tmp_path: Path) -> None:
    from remote import setup
    from tests.conftest import ROOT

    user = {
        line.split("==")[0].lower() for line in (ROOT / "requirements.txt").read_text().splitlines() if line and not line.startswith("#")
    }
    assert not user & {"torch", "pytest", "ruff", "numpy", "tensorboard"}  # those are scripts/test's
    assert 'gpu-train = "gpu_train.launcher:main"' in (ROOT / "pyproject.toml").read_text()
    script = tmp_path / "venv" / "bin" / "gpu-train"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    bin_dir = tmp_path / "home" / ".local" / "bin"
    assert setup.link_command(bin_dir, script) == f"{bin_dir / 'gpu-train'} -> {script}"
    assert (bin_dir / "gpu-train").resolve() == script and "(already)" in setup.link_command(bin_dir, script)
    (bin_dir / "gpu-train").unlink()
    (bin_dir / "gpu-train").write_text("someone else's\n")
    assert "left alone" in setup.link_command(bin_dir, script)  # never replaces a file that is not our link
    findings = {f.what: f for f in setup.ssh_findings()}
    assert findings["ssh (OpenSSH client)"].ok and findings["rsync 3.4+"].ok


def test_installed_alone_the_command_says_it_runs_from_its_clone(tmp_path: Path) -> None:
    """A wheel holds gpu_train only (no generic `remote`/`infra` names): its command says how to install."""
    from tests.conftest import ROOT

    site = tmp_path / "site" / "gpu_train"
    site.mkdir(parents=True)
    for name in ("__init__.py", "launcher.py"):
        (site / name).write_bytes((ROOT / "gpu_train" / name).read_bytes())
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            f"import sys; sys.path.insert(0, {str(site.parent)!r}); from gpu_train.launcher import main; main()",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1 and "gpu-train runs from its clone" in out.stderr, out.stderr
    assert 'include = ["gpu_train*"]' in (ROOT / "pyproject.toml").read_text()
