"""What train adds to a user's own job, and nothing more: no flag it did not ask for, which start this
is (GPU_TRAIN_RESUMES), resume arguments once a checkpoint exists, `resume` of the interrupted run,
pushed data where the code reads it, and secrets kept off every command line. Real sshd, screen and
Python on loopback; a reboot is every process of the run's screen session SIGKILLed, then `boot`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import FAB, ROOT, Lab, project_id
from tests.unit.test_resilience import agent_cmd, reboot, wait_state

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# A script in the style of real projects: argparse that rejects any flag it does not know, its own
# out_dir in the working directory, and a resume flag of its own.
STRICT = """\
import argparse, os, pathlib, time
p = argparse.ArgumentParser()
p.add_argument("--out_dir", default="out")
p.add_argument("--init_from", default="scratch", choices=["scratch", "resume"])
p.add_argument("--sleep", type=float, default=0)
a = p.parse_args()
print(f"start resumes={os.environ['GPU_TRAIN_RESUMES']} init_from={a.init_from}", flush=True)
if a.init_from == "resume":
    print("loaded", pathlib.Path(a.out_dir, "ckpt.pt").read_text(), flush=True)
time.sleep(a.sleep)
print("done", flush=True)
"""


@pytest.fixture
def strict(tmp_path: Path) -> str:
    code = tmp_path / "strict"
    code.mkdir()
    (code / "train.py").write_text(STRICT)
    return str(code)


def starts(lab: Lab, run: str) -> list[str]:
    return re.findall(r"^start (resumes=\d+ init_from=\w+)$", lab.log(run), re.M)


def wait_starts(lab: Lab, run: str, n: int, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while len(found := starts(lab, run)) < n:
        assert time.monotonic() < deadline, lab.log(run)
        time.sleep(0.05)
    return found


def test_a_script_that_rejects_unknown_flags_runs_as_given(lab: Lab, strict: str) -> None:
    run = lab.train("--dir", strict, "--script", "train.py", "--args", "--out_dir out2")
    info = lab.wait(run)
    assert info["state"] == "succeeded", lab.log(run)
    assert starts(lab, run) == ["resumes=0 init_from=scratch"] and "--job-dir" not in lab.log(run)
    # Asked for, it comes: a script that wants AI Platform's --job-dir gets it.
    (Path(strict) / "aip.py").write_text(
        "import argparse, os\np = argparse.ArgumentParser()\n"
        "p.add_argument('--job-dir', required=True)\na = p.parse_args()\n"
        "assert a.job_dir == os.environ['JOB_DIR']\nprint('job dir', a.job_dir)\n"
    )
    run = lab.train("--dir", strict, "--script", "aip.py", "--pass-job-dir")
    assert lab.wait(run)["state"] == "succeeded", lab.log(run)
    assert f"job dir {lab.remote / 'runs' / run / 'job'}" in lab.log(run)


def test_relaunches_count_and_add_the_resume_args_once_the_checkpoint_exists(lab: Lab, strict: str, plain: str) -> None:
    run = lab.train(
        "--dir", strict, "--script", "train.py", "--args", "--sleep 60", "--resume-args", "--init_from=resume", "--resume-if", "out/ckpt.pt"
    )
    assert wait_starts(lab, run, 1) == ["resumes=0 init_from=scratch"]
    # Killed before its first checkpoint: the relaunch starts fresh, with the original arguments.
    reboot(lab, run)
    assert agent_cmd(lab, "boot")["actions"] == [{"runId": run, "action": "resumed", "resumes": 1}]
    assert wait_starts(lab, run, 2)[1] == "resumes=1 init_from=scratch"
    assert "out/ckpt.pt not there yet: starting fresh" in lab.log(run)
    # It checkpoints in its own out_dir; the next relaunch resumes from it.
    ckpt = lab.remote / "runs" / run / "code" / "out" / "ckpt.pt"
    ckpt.parent.mkdir()
    ckpt.write_text("step 500")
    reboot(lab, run)
    agent_cmd(lab, "boot")
    assert wait_starts(lab, run, 3)[2] == "resumes=2 init_from=resume"
    assert "loaded step 500" in lab.log(run)
    # Killed again, no boot: interrupted. A newer run that succeeded is not what `resume` takes.
    wait_state(lab, run, ("running",))
    reboot(lab, run)
    other = lab.train("--dir", plain, "--command", "true", "--name", "quick")
    assert lab.wait(other)["state"] == "succeeded"
    assert lab.run_state(run)["state"] == "interrupted"
    out = lab.fab("resume", check=True).stdout
    assert f"{run}: restarted" in out
    assert wait_starts(lab, run, 4)[3] == "resumes=3 init_from=resume"
    assert lab.run_state(other)["resumes"] == 0
    lab.fab("stop", "--run", run, "--grace", "1", check=True)
    refused = lab.fab("resume")
    assert refused.returncode != 0
    assert "no interrupted run to resume" in refused.stderr and f"resume --stack lab --run {other}" in refused.stderr
    assert json.loads((lab.remote / "runs" / run / "state.json").read_text())["state"] == "stopped"


READS_DATA = """\
import os, pathlib
d = pathlib.Path("data/shakespeare_char")
print("train.bin", d.joinpath("train.bin").read_bytes().hex())
print("prepare", d.joinpath("prepare.py").read_text().strip())
print("other", pathlib.Path("data/other/x.bin").read_bytes().hex())
print("new", pathlib.Path("data/new/deep/y.bin").read_bytes().hex())
"""


def test_pushed_data_is_merged_into_the_codes_own_folder_of_that_name(lab: Lab) -> None:
    """nanoGPT's layout: data/shakespeare_char/prepare.py is code (in git), the .bin files it made are
    data (ignored, pushed); the job reads data/shakespeare_char/train.bin from its working directory."""
    project = lab.cwd
    (project / "train.py").write_text(READS_DATA)
    own = project / "data" / "shakespeare_char"
    own.mkdir(parents=True)
    (own / "prepare.py").write_text("print('v1')\n")
    (own / "train.bin").write_bytes(b"\x01\x02")
    (project / "data" / "other").mkdir()
    (project / "data" / "other" / "x.bin").write_bytes(b"\x03")
    (project / "data" / "new" / "deep").mkdir(parents=True)  # a folder the code does not have at all
    (project / "data" / "new" / "deep" / "y.bin").write_bytes(b"\x04")
    (project / ".gputrainignore").write_text("*.bin\ndata/new/\n")
    lab.fab("push", "data", check=True)
    run = lab.train("--script", "train.py")
    assert lab.wait(run)["state"] == "succeeded", lab.log(run)
    log = lab.log(run)
    assert "train.bin 0102" in log and "prepare print('v1')" in log and "other 03" in log and "new 04" in log
    pushed = lab.remote / "data" / project_id(lab.home, lab.cwd)  # REMOTE_ROOT/data/PROJECT_ID
    assert os.readlink(lab.remote / "runs" / run / "code" / "data" / "new") == str(pushed / "data" / "new")
    code = lab.remote / "runs" / run / "code"
    data_dir = lab.remote / "data" / project_id(lab.home, lab.cwd)
    assert (code / "data" / "shakespeare_char").is_dir() and not (code / "data" / "shakespeare_char").is_symlink()
    assert os.readlink(code / "data" / "shakespeare_char" / "train.bin") == str(data_dir / "data/shakespeare_char/train.bin")
    assert os.readlink(code / "data" / "other" / "x.bin") == str(data_dir / "data" / "other" / "x.bin")
    assert not (code / "data" / "shakespeare_char" / "prepare.py").is_symlink()  # the same file in both: the code's
    assert "differ" not in log
    # The code's copy changed since the push: the code's own is used, and the log says so.
    (own / "prepare.py").write_text("print('v2')\n")
    run = lab.train("--script", "train.py")
    assert lab.wait(run)["state"] == "succeeded", lab.log(run)
    log = lab.log(run)
    assert "prepare print('v2')" in log and "train.bin 0102" in log
    assert (
        "data/shakespeare_char/prepare.py: the code and the pushed data both have it, and they differ: the code's own copy is used"
    ) in log


USES_SECRETS = """\
import hashlib, os, time
for name in ("TOKEN", "API_KEY"):
    print(name, hashlib.sha256(os.environ[name].encode()).hexdigest(), flush=True)
time.sleep(float(os.environ.get("HOLD", "0")))
"""


class CmdlineWatch:
    """Every process's command line, read again and again from /proc while it runs: any that holds
    ``secrets`` is kept (a command line is readable by every user of a host)."""

    def __init__(self, secrets: list[bytes]):
        self.secrets, self.seen, self.reads = secrets, [], 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def watch(self) -> None:
        while not self.done.is_set():
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    with contextlib.suppress(OSError):
                        cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                        if any(s in cmd for s in self.secrets):
                            self.seen.append(cmd)
            self.reads += 1
            time.sleep(0.005)

    def stop(self) -> list[bytes]:
        self.done.set()
        self.thread.join()
        return self.seen


def test_secrets_stay_off_every_command_line_and_out_of_status_and_logs(lab: Lab, tmp_path: Path) -> None:
    code = tmp_path / "secret-job"
    code.mkdir()
    (code / "job.py").write_text(USES_SECRETS)
    token, key = f"tok-{uuid.uuid4().hex}", f"key {uuid.uuid4().hex}"
    env_file = tmp_path / "secrets.env"
    env_file.write_text(f"# the job's keys\nexport API_KEY='{key}'\nHOLD=3\n")
    env = {**lab.env, "TOKEN": token}
    watch = CmdlineWatch([token.encode(), key.encode()])
    try:
        started = subprocess.run(
            [
                FAB,
                "--search-root",
                str(ROOT),
                "train",
                "--dir",
                str(code),
                "--script",
                "job.py",
                "--env",
                "TOKEN",
                "--env-file",
                str(env_file),
                "--json",
            ],
            env=env,
            cwd=lab.cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert started.returncode == 0, started.stderr
        run = json.loads(started.stdout)["runId"]
        wait_state(lab, run, ("running",))
        wait_starts_line = time.monotonic() + 30
        while "API_KEY" not in lab.log(run) and time.monotonic() < wait_starts_line:
            time.sleep(0.05)
        reads_while_running = watch.reads
        info = lab.wait(run)
    finally:
        seen = watch.stop()
    assert seen == [] and watch.reads > reads_while_running > 0  # looked at while it launched and while it ran
    assert info["state"] == "succeeded", lab.log(run)
    log = lab.log(run)
    assert f"TOKEN {hashlib.sha256(token.encode()).hexdigest()}" in log  # the job got the very values
    assert f"API_KEY {hashlib.sha256(key.encode()).hexdigest()}" in log
    spec = lab.remote / "runs" / run / "spec.json"
    assert stat.S_IMODE(spec.stat().st_mode) == 0o600 and token in spec.read_text()  # kept, for relaunches only
    shown = [
        started.stdout,
        started.stderr,
        lab.fab("status", check=True).stdout,
        lab.fab("status", "--json", check=True).stdout,
        lab.fab("logs", "--run", run, "--lines", "0", check=True).stdout,
    ]
    assert not [s for s in shown if token in s or key in s]
    # A relaunch has them still, from the 0600 spec: nothing is sent again.
    lab.fab("resume", "--run", run, check=True)
    lab.wait(run, ("succeeded",), timeout=60)
    while lab.log(run).count("TOKEN ") < 2:
        time.sleep(0.05)
    assert lab.log(run).count(f"TOKEN {hashlib.sha256(token.encode()).hexdigest()}") == 2


def test_a_secret_missing_from_the_laptops_environment_stops_train_before_anything_is_sent(lab: Lab, plain: str) -> None:
    env = {k: v for k, v in lab.env.items() if k != "NO_SUCH_TOKEN"}
    out = subprocess.run(
        [FAB, "--search-root", str(ROOT), "train", "--dir", plain, "--command", "true", "--env", "NO_SUCH_TOKEN"],
        env=env,
        cwd=lab.cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "--env NO_SUCH_TOKEN: NO_SUCH_TOKEN is not set in this shell's environment; export it first" in out.stderr
    assert "syncing" not in out.stderr and not (lab.remote / "runs").exists() and not (lab.remote / "staging").exists()
