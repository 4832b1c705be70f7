"""`gpu-train` from a researcher's own project, outside this repository, against real sshds.

The project is a git repo in a temporary directory with a gitignored data/; HOME is a temporary
directory too, so nothing of the user's own ssh setup is read or written. A passphrase key goes
through a real ssh-agent; a jump host is a second sshd. This suite's loopback addresses are 127.0.14.x.
"""

from __future__ import annotations

import os
import signal
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
        for name, text in {".gitignore": "data/\n__pycache__/\n", "hello.py": HELLO, "crash.py": CRASH,
                           "uses_data.py": USES_DATA, "requirements.txt": "# nothing yet\n"}.items():
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
        result = subprocess.run([GPU_TRAIN, *args], cwd=cwd or self.dir, env=self.env, capture_output=True, text=True,
                                timeout=timeout, stdin=subprocess.DEVNULL)
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


# -- the loop from a project directory --------------------------------------------------------
@pytest.mark.long  # a user's whole first session: venv, pip, push, fetch
def test_init_train_crash_push_fetch_train_again(proj: Project, sshd) -> None:
    server = sshd("127.0.14.1")
    init = proj.run("init", "--host", server.spec, "--key", str(server.client_key), check=True)
    stack = proj.dir / "stacks" / "Pulumi.lab.yaml"
    assert f"wrote {stack}" in init.stdout and "next:" in init.stdout
    assert ".gpu-train/" in (proj.dir / ".gitignore").read_text() and "runs/" in (proj.dir / ".gitignore").read_text()
    assert proj.run("init", "--host", server.spec).returncode == 1  # never replaces a stack
    with stack.open("a") as f:  # what the user edits: where gpu-train lives on the host, and its Python (the
        # system's, not a venv's: a venv's Python is used as it is, and this test is about the project's own venv)
        f.write(f"  gpu-train:remoteRoot: {proj.remote}\n  gpu-train:python: /usr/bin/python3\n")

    typo = proj.run("trian")
    assert typo.returncode == 2 and "Did you mean train?" in typo.stderr
    wrong = proj.run("status", "--stack", "lob")
    assert wrong.returncode == 2 and "did you mean lab?" in wrong.stderr

    sub = proj.dir / "src"
    sub.mkdir()
    first = proj.run("train", "--script", "hello.py", "--follow", cwd=sub, check=True)  # the project is found from below
    env = proj.remote / "envs" / "my-model"
    assert f"hello from the job in {env}" in first.stdout  # the project's own venv
    assert "creating the project's virtual environment" in first.stdout
    assert "left out: data/ 3.0 MiB, ignored by .gitignore" in first.stderr and "gpu-train push" in first.stderr
    assert "first contact with" in first.stderr
    hello = started_run(first)

    crash = proj.run("train", "--script", "crash.py", "--name", "no-data", "--follow")
    assert crash.returncode == 1 and "loading" in crash.stdout and "Traceback" in crash.stdout
    crashed = started_run(crash)
    assert crashed.startswith("no_data_")
    table = proj.run("status", check=True).stdout.splitlines()
    header = next(line for line in table if "RUN" in line)
    assert header.split() == ["RUN", "STATE", "EXIT", "DURATION", "OUTPUTS", "LAST", "LINE"]
    row = next(line for line in table if crashed in line)
    assert "failed" in row and "FileNotFoundError: [Errno 2] No such file or directory: 'data/train.csv'" in row
    assert proj.run("status", "--json", check=True).stdout.lstrip().startswith("{")

    pushed = proj.run("push", "data", check=True)
    assert "$DATA_DIR/data" in pushed.stdout
    assert (proj.remote / "data" / "my-model" / "data" / "train.csv").stat().st_size == 3 * 1024 * 1024
    again = proj.run("train", "--script", "crash.py", "--follow", check=True)  # data/ is there now
    assert "3145728 bytes of data" in again.stdout and "creating the project's virtual environment" not in again.stdout
    assert "DATA_DIR has ['data']" in proj.run("train", "--script", "uses_data.py", "--follow", check=True).stdout

    assert "loading" in proj.run("logs", "--run", "no_da", check=True).stdout  # a prefix of the run id
    unknown = proj.run("logs", "--run", "hellp")
    assert unknown.returncode == 1 and f"did you mean {hello}" in unknown.stderr

    proj.run("fetch", "--run", hello, check=True)
    assert (proj.dir / "runs" / "lab" / hello).is_dir()
    last = proj.run("train", "--script", "hello.py", "--follow", check=True)
    assert "runs/" in last.stderr and "fetched results" in last.stderr
    code = proj.remote / "runs" / started_run(last) / "code"
    assert (code / "hello.py").is_file() and not (code / "runs").exists() and not (code / ".gpu-train").exists()
    assert (code / "data").is_symlink()  # DATA_DIR's data/, not a copy of the laptop's

    (proj.dir / "requirements.txt").write_text("./no-such-package-dir\n")
    bad = proj.run("train", "--script", "hello.py", "--follow")
    assert bad.returncode == 1 and "[gpu-train] pip: " in bad.stdout and "pip.log" in bad.stdout
    assert "pip install -r requirements.txt failed" in proj.run("status", check=True).stdout

    (proj.dir / "requirements.txt").write_text("")
    (proj.dir / "slow.py").write_text("import time\nprint('tick', flush=True)\ntime.sleep(120)\n")
    follower = subprocess.Popen([GPU_TRAIN, "train", "--script", "slow.py", "--follow"], cwd=proj.dir, env=proj.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    for line in follower.stdout:
        if line.strip() == "tick":
            break
    follower.send_signal(signal.SIGINT)  # Ctrl-C: detach, the job goes on
    _, err = follower.communicate(timeout=30)
    assert follower.returncode == 130 and "detached" in err and "Traceback" not in err
    slow = next(line for line in proj.run("status", check=True).stdout.splitlines() if "slow_" in line)
    assert "running" in slow
    proj.run("stop", "--run", "slow", "--grace", "1", check=True)  # a base name: its newest run

    one = proj.run("ssh", "--", "echo $((6*7)); exit 3")
    assert one.returncode == 3 and one.stdout.strip() == "42"


# -- researchers' SSH -----------------------------------------------------------------------------
def _start_agent(tmp: Path) -> tuple[str, int]:
    sock = str(tmp / "agent.sock")
    out = subprocess.run(["ssh-agent", "-a", sock, "-s"], capture_output=True, text=True, check=True).stdout
    pid = int(out.split("SSH_AGENT_PID=")[1].split(";")[0])
    return sock, pid


def test_passphrase_key_through_a_real_ssh_agent(proj: Project, sshd, tmp_path: Path) -> None:
    key = tmp_path / "locked_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "correct horse", "-f", str(key)], check=True)
    server = sshd("127.0.14.2", key)
    proj.stack("lab", f"  gpu-train:hosts: ['{server.spec}']\n  gpu-train:sshKey: {key}\n"
                      f"  gpu-train:remoteRoot: {proj.remote}\n  gpu-train:python: {sys.executable}\n")
    locked = proj.run("status")
    assert locked.returncode == 3 and f"ssh-add {key}" in locked.stderr and "passphrase" in locked.stderr

    sock, pid = _start_agent(tmp_path)
    try:
        askpass = tmp_path / "askpass"
        askpass.write_text("#!/bin/sh\necho 'correct horse'\n")
        askpass.chmod(0o700)
        subprocess.run(["ssh-add", str(key)], env={**proj.env, "SSH_AUTH_SOCK": sock, "SSH_ASKPASS": str(askpass),
                                                    "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0"},
                       stdin=subprocess.DEVNULL, capture_output=True, check=True)
        proj.agent_sock = sock
        run = started_run(proj.run("train", "--script", "hello.py", check=True))  # paramiko, signing through the agent
        proj.run("logs", "--run", run, "--follow", check=True)
        proj.run("fetch", "--run", run, check=True)  # OpenSSH (rsync), through the same agent
        assert (proj.dir / "runs" / "lab" / run).is_dir()
    finally:
        os.kill(pid, signal.SIGTERM)


def test_alias_and_proxyjump_from_an_ssh_config(proj: Project, sshd, tmp_path: Path) -> None:
    box, jump = sshd("127.0.14.3"), sshd("127.0.14.4")
    conf = tmp_path / "ssh_config"
    conf.write_text(f"Host labbox\n  HostName {box.address}\n  Port {box.port}\n  User {box.user}\n"
                    f"  IdentityFile {box.client_key}\n  ProxyJump jumpbox\n\n"
                    f"Host jumpbox\n  HostName {jump.address}\n  Port {jump.port}\n  User {jump.user}\n"
                    f"  IdentityFile {jump.client_key}\n")
    proj.stack("lab", f"  gpu-train:hosts: [labbox]\n  gpu-train:sshConfig: {conf}\n"
                      f"  gpu-train:remoteRoot: {proj.remote}\n  gpu-train:python: {sys.executable}\n")
    first = proj.run("train", "--script", "hello.py", check=True)
    assert f"first contact with [{jump.address}]:{jump.port}" in first.stderr  # the jump host was used
    run = started_run(first)
    proj.run("logs", "--run", run, "--follow", check=True)
    proj.run("fetch", "--run", run, check=True)  # OpenSSH through a ProxyCommand built the same way
    assert (proj.dir / "runs" / "lab" / run).is_dir()

    jump.stop()
    down = proj.run("status")
    assert down.returncode == 3 and f"connection refused by {jump.address}:{jump.port} (jumpbox)" in down.stderr
    assert "jump host on the way to labbox" in down.stderr


def test_refused_and_unresolvable_hosts_fail_at_once(proj: Project) -> None:
    key = proj.tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    started = time.monotonic()
    proj.run("--version", check=True)
    baseline = time.monotonic() - started  # starting Python and Fabric, on a busy machine
    port = free_port("127.0.14.5")
    for host, words in ((f"root@127.0.14.5:{port}", f"connection refused by 127.0.14.5:{port}"),
                        ("root@gpu-box.invalid", "cannot resolve the host name 'gpu-box.invalid'")):
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
@pytest.mark.parametrize(("inst", "words"), [
    ({"status": "RUNNING"}, None),
    ({"status": "PROVISIONING"}, None),
    ({"status": "TERMINATED", "lastStopTimestamp": "2026-11-22T05:00:00+00:00"}, "is TERMINATED, stopped 2 h ago"),
    ({"status": "SUSPENDED"}, "gcloud compute instances resume vm-0"),
])
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

        google.state["instances"]["proj-1"] = [{
            "name": "gpu-train-t4", "zone": "https://www.googleapis.com/compute/v1/projects/proj-1/zones/us-central1-a",
            "status": "TERMINATED", "lastStopTimestamp": datetime.fromtimestamp(now - 7300, timezone.utc).isoformat()}]
        (proj.dir / "stacks").mkdir()
        (proj.dir / "stacks" / "Pulumi.t4.yaml").write_text(
            "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-central1-a\n  gpu-train:gpuType: nvidia-tesla-t4\n"
            f"  gpu-train:gpuCount: 1\n  gpu-train:spot: true\n  gpu-train:sshSourceRanges: [203.0.113.7/32]\n"
            f"  gpu-train:sshPublicKey: {public_key}\n")
        state = proj.dir / ".gpu-train" / "t4"
        state.mkdir(parents=True)
        (state / "outputs.json").write_text(json.dumps({  # the VM's last known address: nothing listens there now
            "externalIp": "127.0.14.6", "internalIp": "10.0.0.2", "sshUser": "trainer", "instanceName": "gpu-train-t4",
            "zone": "us-central1-a", "gpuCount": 1}))
        adc = google.adc_file(tmp_path / "adc.json")
        env = {"GOOGLE_APPLICATION_CREDENTIALS": str(adc), "GPU_TRAIN_COMPUTE_ENDPOINT": google.url}
        started = time.monotonic()
        result = subprocess.run([GPU_TRAIN, "status"], cwd=proj.dir, env={**proj.env, **env}, capture_output=True,
                                text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert result.returncode == 3, result.stderr
        assert "the VM gpu-train-t4 is TERMINATED, stopped 2 h ago" in result.stderr
        assert "gcloud compute instances start gpu-train-t4 --zone us-central1-a --project proj-1" in result.stderr
        assert time.monotonic() - started < 30  # not the 600 s SSH wait
    finally:
        google.close()


# -- the user's install -----------------------------------------------------------------------------
def test_user_install_is_lean_and_links_the_command(tmp_path: Path) -> None:
    from infra.ops import setup
    from tests.conftest import ROOT

    user = {line.split("==")[0].lower() for line in (ROOT / "requirements.txt").read_text().splitlines()
            if line and not line.startswith("#")}
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
    out = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(site.parent)!r}); "
                          "from gpu_train.launcher import main; main()"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "gpu-train runs from its clone" in out.stderr, out.stderr
    assert 'include = ["gpu_train*"]' in (ROOT / "pyproject.toml").read_text()
