"""The fab tasks end to end, against a real sshd, screen and rsync on loopback.

Every call runs the real `fab` executable, as a user would, on an SSH stack written for the test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE, Lab, after_the_second_of


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}


# -- the whole loop ---------------------------------------------------------------------------
def test_train_follow_status_fetch_the_example(lab: Lab) -> None:
    started = lab.fab("train", "--dir", str(EXAMPLE), "--script", "train.py", "--args", "--steps 120 --checkpoint-every 40", check=True)
    run = started.stdout.split()[1]
    assert run.startswith("train_") and len(run) == len("train_20260101_000000")
    assert "first contact with" in started.stderr and "SHA256:" in started.stderr
    assert "syncing" in started.stderr and "fab logs" in started.stdout

    follow = lab.fab("logs", "--follow")
    assert follow.returncode == 0, follow.stderr
    assert "done: step 120" in follow.stdout and f"{run}: succeeded, exit code 0" in follow.stderr

    info = lab.run_state(run)
    assert (info["state"], info["exitCode"]) == ("succeeded", 0)
    assert info["jobDir"] == str(lab.remote / "runs" / run / "job")
    assert "--job-dir" not in lab.log(run)  # no flag it did not ask for: the example reads $JOB_DIR

    text = lab.fab("status", check=True).stdout
    assert run in text and "succeeded" in text

    lab.fab("fetch", check=True)
    local = lab.cwd / "runs" / "lab" / run
    host = {**tree_digest(Path(info["jobDir"])), ".gpu-train/log": sha256(lab.remote / "runs" / run / "log")}  # and its log
    assert tree_digest(local) == host
    assert sorted(p.name for p in (local / "checkpoints").iterdir()) == ["ckpt_00000040.pt", "ckpt_00000080.pt", "ckpt_00000120.pt"]
    assert not list(local.parent.glob(".*partial*"))

    second = lab.fab("fetch", check=True)
    assert f"{run}: up to date" in second.stderr  # nothing changed on either side: nothing sent
    (local / "checkpoints" / "ckpt_00000040.pt").unlink()  # a local change is noticed
    assert f"{run}: fetched 1 file(s)" in lab.fab("fetch", check=True).stderr
    assert tree_digest(local) == host


def test_env_run_id_job_dir_and_requirements_of_comments(lab: Lab) -> None:
    code = lab.tmp / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("# nothing to install\n")
    cmd = 'echo "rid=$RUN_ID jd=$JOB_DIR greet=$GREETING ssh=${SSH_CONNECTION:-none}"; pwd; echo ok > "$JOB_DIR/out.txt"'
    run = lab.train("--dir", str(code), "--command", cmd, "--name", "envcheck", "--env", "GREETING=hello world")
    assert lab.wait(run)["state"] == "succeeded"
    log = lab.log(run)
    # Nothing of the SSH session that launched it, as after a reboot; and so the job's bash did not read the
    # login user's ~/.bashrc (the lab host's changes folder: remote/loopback.py): it runs in its code folder.
    assert f"rid={run} jd={lab.remote}/runs/{run}/job greet=hello world ssh=none" in log
    assert f"{lab.remote}/runs/{run}/code" in log
    assert "installing" not in log and "uv" not in log  # a requirements.txt of comments: no tool is even looked for


def test_sync_honours_ignores_and_links_unchanged_files(lab: Lab) -> None:
    code = lab.tmp / "proj"
    (code / "data").mkdir(parents=True)
    (code / "sub").mkdir()
    (code / "train.py").write_text("print('hi')\n")
    (code / "data" / "big.bin").write_bytes(os.urandom(1000))
    (code / "sub" / "keep.py").write_text("x = 1\n")
    (code / "sub" / "scratch.tmp").write_text("junk\n")
    (code / "notes.secret").write_text("s\n")
    (code / ".gitignore").write_text("data/\n*.tmp\n")
    (code / ".gputrainignore").write_text("*.secret\n")
    subprocess.run(["git", "init", "-q", str(code)], check=True)
    run = lab.train("--dir", str(code), "--script", "train.py")
    lab.wait(run)
    remote_code = lab.remote / "runs" / run / "code"
    sent = sorted(str(p.relative_to(remote_code)) for p in remote_code.rglob("*") if p.is_file())
    assert sent == [".gitignore", ".gputrainignore", "sub/keep.py", "train.py"]

    after_the_second_of(run)  # a new run id
    run2 = lab.train("--dir", str(code), "--script", "train.py")
    lab.wait(run2)
    a, b = remote_code / "train.py", lab.remote / "runs" / run2 / "code" / "train.py"
    # unchanged: not sent again (the last run's, through --link-dest), yet an inode of its own: a job that
    # rewrites its code in place must not rewrite an earlier run's
    assert a.stat().st_ino != b.stat().st_ino and a.stat().st_mtime_ns == b.stat().st_mtime_ns and a.read_bytes() == b.read_bytes()


def test_outside_git_rsync_reads_gitignore(lab: Lab) -> None:
    code = lab.tmp / "plain"
    code.mkdir()
    (code / "run.py").write_text("")
    (code / "out.log").write_text("x")
    (code / ".gitignore").write_text("*.log\n")
    run = lab.train("--dir", str(code), "--script", "run.py")
    lab.wait(run)
    remote_code = lab.remote / "runs" / run / "code"
    assert sorted(str(p.relative_to(remote_code)) for p in remote_code.rglob("*") if p.is_file()) == [".gitignore", "run.py"]


def test_job_crash_is_failed_with_its_exit_code_and_log(lab: Lab, plain: str) -> None:
    run = lab.train("--dir", plain, "--command", "echo about to fail; exit 3", "--name", "crash")
    follow = lab.fab("logs", "--follow", "--run", run)
    assert follow.returncode == 3 and "about to fail" in follow.stdout
    info = lab.run_state(run)
    assert (info["state"], info["exitCode"]) == ("failed", 3)
    row = next(line for line in lab.fab("status").stdout.splitlines() if run in line)
    assert row.split()[1:3] == ["failed", "3"] and row.endswith("about to fail")  # state, exit code, the job's line
    assert "about to fail" in lab.log(run)


def test_stop_escalates_sigint_sigterm_sigkill(lab: Lab, plain: str) -> None:
    stubborn = "trap 'echo got INT' INT; trap 'echo got TERM' TERM; echo armed; while true; do sleep 0.1; done"
    run = lab.train("--dir", plain, "--command", stubborn, "--name", "stubborn")
    deadline = time.monotonic() + 30
    while "armed" not in lab.log(run) and time.monotonic() < deadline:  # its traps are set
        time.sleep(0.05)
    out = lab.fab("stop", "--grace", "1", check=True).stdout
    assert f"{run}: stopped (SIGINT, SIGTERM, SIGKILL)" in out
    pid = json.loads((lab.remote / "runs" / run / "state.json").read_text())["pid"]
    assert not Path(f"/proc/{pid}").exists()
    assert "got INT" in lab.log(run) and "got TERM" in lab.log(run)
    assert lab.run_state(run)["state"] == "stopped"


def test_stop_of_a_polite_job_needs_only_sigint(lab: Lab, example: str) -> None:
    run = lab.train("--dir", example, "--script", "train.py", "--args", "--steps 100000 --step-time 0.01")
    deadline = time.monotonic() + 30
    while "step 10 " not in lab.log(run) and time.monotonic() < deadline:
        time.sleep(0.2)
    out = lab.fab("stop", check=True).stdout
    assert "(SIGINT)" in out
    assert "saved ckpt_" in lab.log(run)  # the example checkpoints on SIGINT


def test_two_trains_with_one_name_at_once(lab: Lab, plain: str) -> None:
    args = ("train", "--dir", plain, "--command", "sleep 30", "--name", "same")
    procs = [lab.spawn(*args) for _ in range(2)]
    results = [(p.wait(60), p.stdout.read(), p.stderr.read()) for p in procs]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 1], results
    started, refused = (next(r for r in results if r[0] == code) for code in (0, 1))
    run = started[1].split()[1]
    # Which refusal depends on the clock alone: the same second, the same run id; a second later, another id.
    same_second = f"run {run} already exists on this host: pick another --name"
    later = f"a run named 'same' is already running ({run})"
    assert [same_second in refused[2], later in refused[2]].count(True) == 1, refused
    lab.fab("stop", "--grace", "1", check=True)


def test_host_down_is_refused_at_once(lab: Lab) -> None:
    lab.sshd.stop()
    started = time.monotonic()
    result = lab.fab("status", "--json")
    elapsed = time.monotonic() - started
    assert result.returncode == 3
    assert "connection refused by" in result.stderr and lab.sshd.spec.split("@")[1] in result.stderr
    assert elapsed < 5  # no waiting: nothing listens there


def test_changed_host_key_is_refused(lab: Lab) -> None:
    lab.fab("status", check=True)  # learns the key
    lab.sshd.stop()
    lab.sshd.new_host_key()
    lab.sshd.start()
    result = lab.fab("status")
    assert result.returncode == 3
    assert "CHANGED" in result.stderr and "ssh-keygen -f" in result.stderr and "-R" in result.stderr


def test_pinned_known_hosts_refuses_unknown_hosts(lab: Lab) -> None:
    pinned = lab.tmp / "pinned_known_hosts"
    pinned.write_text("")
    lab.sshd.stack_file(lab.stacks, "lab", lab.remote, sys.executable, f"  gpu-train:knownHosts: {pinned}\n")
    result = lab.fab("status")
    assert result.returncode == 3 and "pins host keys" in result.stderr
    assert pinned.read_text() == ""  # never written
    key = (lab.sshd.host_key.with_suffix(".pub")).read_text().split()
    pinned.write_text(f"[{lab.sshd.address}]:{lab.sshd.port} {key[0]} {key[1]}\n")
    assert lab.fab("status").returncode == 0


def test_fetch_survives_a_killed_sshd(lab: Lab, plain: str) -> None:
    big = "python3 -c \"import os; [open(os.environ['JOB_DIR'] + f'/part{i}.bin', 'wb').write(os.urandom(300 << 20)) for i in range(2)]\""
    run = lab.train("--dir", plain, "--command", big, "--name", "big")
    assert lab.wait(run, timeout=120)["state"] == "succeeded"
    job = Path(lab.run_state(run)["jobDir"])
    fetch = lab.spawn("fetch", "--run", run)
    dest = lab.cwd / "runs" / "lab" / run
    partial = dest.parent / f".{run}.gpu-train-partial"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(p.is_file() for p in partial.rglob("*")):
        time.sleep(0.02)
    lab.sshd.stop()  # mid-transfer
    assert fetch.wait(60) != 0
    assert "run it again to resume" in fetch.stderr.read()
    assert not (dest / "part1.bin").exists()  # nothing half-written where results are read
    lab.sshd.start()
    lab.fab("fetch", "--run", run, check=True)
    assert tree_digest(dest) == {**tree_digest(job), ".gpu-train/log": sha256(job.parent / "log")}  # and the run's log
    assert not partial.exists()


def test_fetch_never_replaces_a_newer_local_file(lab: Lab, plain: str) -> None:
    run = lab.train("--dir", plain, "--command", 'echo remote > "$JOB_DIR/result.txt"', "--name", "res")
    lab.wait(run)
    dest = lab.cwd / "runs" / "lab" / run
    dest.mkdir(parents=True)
    (dest / "result.txt").write_text("edited locally\n")
    later = time.time() + 60
    os.utime(dest / "result.txt", (later, later))  # clearly newer than the host's
    lab.fab("fetch", "--run", run, check=True)
    assert (dest / "result.txt").read_text() == "edited locally\n"


def streaming_agents(lab: Lab) -> list[int]:
    """The host's agents streaming a log with --follow for this lab (their command lines say so)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if str(lab.remote) in cmd and "logs" in cmd and "--follow" in cmd:
            found.append(int(entry))
    return found


@pytest.mark.parametrize("drop", ["streaming", "starting"])
def test_logs_follow_reconnects_after_a_dropped_connection(lab: Lab, plain: str, drop: str) -> None:
    # Half the ticks, then the job waits for `go`: the connection drops while the log is being followed
    # ("streaming"), or while the host's agent is still starting, before its start mark ("starting": the
    # drop had read as "the log could not be read"); sshd comes back the moment its sessions are gone.
    ticker = (
        'for i in $(seq 1 20); do echo "tick $i"; sleep 0.1; done; '
        'while [ ! -e "$JOB_DIR/go" ]; do sleep 0.1; done; for i in $(seq 21 40); do echo "tick $i"; done'
    )
    run = lab.train("--dir", plain, "--command", ticker, "--name", "ticker")
    deadline = time.monotonic() + 60
    while drop == "starting" and "tick 20" not in lab.log(run) and time.monotonic() < deadline:
        time.sleep(0.1)
    follower = lab.spawn("logs", "--follow", "--lines", "0", "--run", run)
    while not (streaming_agents(lab) and "tick 20" in lab.log(run)) and time.monotonic() < deadline:
        time.sleep(0.1 if drop == "streaming" else 0.005)
    assert streaming_agents(lab), "the follower never started streaming"
    lab.sshd.stop()  # every session dies; the job (under screen) does not
    while streaming_agents(lab) and time.monotonic() < deadline:
        time.sleep(0.01)
    lab.sshd.start()  # at once: the follower's reconnect meets the new sshd
    (lab.remote / "runs" / run / "job" / "go").touch()
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    ticks = [line for line in out.splitlines() if line.startswith("tick ")]
    assert ticks == [f"tick {i}" for i in range(1, 41)]  # every line once: no gap, no repeat
    assert "reconnecting" in err


def test_logs_tail_and_errors(lab: Lab, plain: str) -> None:
    run = lab.train("--dir", plain, "--command", "seq 1 100", "--name", "counter")
    lab.wait(run)
    out = lab.fab("logs", "--lines", "3", check=True).stdout.splitlines()
    assert len(out) == 3 and out[:2] == ["99", "100"] and out[2].startswith("[gpu-train]")
    missing = lab.fab("logs", "--run", "nope_20260101_000000")
    assert missing.returncode == 1 and "no run 'nope_20260101_000000'" in missing.stderr


def test_down_refuses_while_running_then_fetches_everything(lab: Lab, plain: str) -> None:
    run = lab.train("--dir", plain, "--command", "sleep 30", "--name", "busy")
    lab.wait(run, ("running",))
    refused = lab.fab("down")
    assert refused.returncode == 1 and f"still running: {run}" in refused.stderr
    lab.fab("stop", "--grace", "1", check=True)
    done = lab.fab("down", check=True)
    assert "nothing to destroy" in done.stdout
    assert (lab.cwd / "runs" / "lab" / run).is_dir()


def test_gpus_without_nvidia_smi(lab: Lab) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    assert "no nvidia-smi on this host" in lab.fab("nvidia-smi", check=True).stdout


def test_bad_input_fails_before_anything_is_copied(lab: Lab, plain: str) -> None:
    cases = [
        (("--dir", str(EXAMPLE)), "exactly one of --script"),
        (("--dir", str(EXAMPLE), "--script", "nope.py"), "no such file"),
        (("--dir", str(lab.tmp / "missing"), "--script", "x.py"), "no such directory"),
        (("--dir", str(EXAMPLE), "--script", "train.py", "--name", "9lives"), "--name '9lives'"),
        (("--dir", str(EXAMPLE), "--script", "train.py", "--env", "NOEQUALS"), "NOEQUALS is not set in this shell"),
        (("--dir", plain, "--command", "true", "--args", "x"), "--args goes with --script"),
    ]
    for args, words in cases:
        result = lab.fab("train", *args)
        assert result.returncode == 2 and words in result.stderr, (args, result.stderr)
    assert not (lab.remote / "runs").exists()


def test_unknown_stack_names_the_fix(lab: Lab) -> None:
    result = lab.fab("status", "--stack", "nope")
    # (fab runs it: its fixes say fab)
    assert result.returncode == 2 and "no stack named 'nope'" in result.stderr and "fab init --stack nope" in result.stderr


def test_unchanged_code_is_reused_and_the_host_checks_the_claim(lab: Lab) -> None:
    code = lab.tmp / "reuse"
    code.mkdir()
    (code / "a.py").write_text("print(1)\n")

    runs: list[str] = []

    def train(said: str) -> str:
        """One run of the same name (a new second, a new run id); its id, once it has finished."""
        if runs:
            after_the_second_of(runs[-1])
        result = lab.fab("train", "--dir", str(code), "--command", "cat a.py", "--name", "re", check=True)
        assert said in result.stderr
        runs.append(result.stdout.split()[1])
        lab.wait(runs[-1])
        return runs[-1]

    train("syncing")
    assert "print(1)" in lab.log(train("unchanged since the last run"))
    # The host lost its copy (a new VM, a wiped disk): the laptop's claim is checked, the code is sent.
    shutil.rmtree(lab.remote / "code")
    run3 = train("unchanged since the last run")
    assert (lab.remote / "runs" / run3 / "code" / "a.py").read_text() == "print(1)\n"
    # A changed file is synced.
    (code / "a.py").write_text("print(2)\n")
    assert "print(2)" in lab.log(train("syncing"))


def test_fetch_refuses_a_run_id_that_is_not_one(lab: Lab) -> None:
    """--run becomes a path here and on the host: refused before anything connects or is written."""
    refused = lab.fab("fetch", "--run", "../../etc")
    assert refused.returncode == 2 and "is not a run id" in refused.stderr
    assert not (lab.cwd / "runs").exists()
