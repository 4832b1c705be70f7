"""Another user on the host: a REMOTE_ROOT they made first, a symlinked or open one, and secrets.

A second local user (created for the test, removed after it) plants an agent in a root it made, links
or opens the root, and scans every process's command line while a job with a secret runs, through
the real `fab` against a real sshd. Nothing of ours may be written where they can reach it, and no
secret may show on a command line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import Lab, run_fab

LAB_ADDRESS = "127.0.10.3"  # test_hostile_hosts' loopback addresses, 127.0.10.x (the `lab` fixture reads it)

# One user per pytest process: xdist workers run the attacker tests at once, and a shared name let one
# worker's teardown delete the user while another's test ran (its files then showed a bare uid).
ATTACKER = f"gtattack{os.getpid()}"
SCANNER = r"""import base64, os, sys, time
secret_file, out, stop = sys.argv[1:4]
with open(secret_file) as f:
    secret = f.read()
hits = {}
while not os.path.exists(stop):
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            seen = list(args)
            for a in args:  # base64 hides nothing
                try:
                    seen.append(base64.b64decode(a, validate=True))
                except ValueError:
                    pass
            if any(secret.encode() in a for a in seen):
                hits[pid] = b" ".join(args).decode("utf-8", "replace")[:300]
    time.sleep(0.01)
with open(out, "w") as f:
    f.write("".join(line + "\n" for line in hits.values()))
"""


@pytest.fixture
def attacker(tmp_path: Path):
    """A second local user, created for the test and removed after it."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to create a second user")
    subprocess.run(["userdel", "-r", ATTACKER], capture_output=True, check=False)
    subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", ATTACKER], check=True)
    shared = Path(tempfile.mkdtemp(prefix="gpu-train-shared-", dir="/tmp"))
    shared.chmod(0o1777)  # like /tmp itself
    yield shared
    subprocess.run(["pkill", "-u", ATTACKER], check=False)
    subprocess.run(["userdel", ATTACKER], check=False)
    shutil.rmtree(shared, ignore_errors=True)


def as_attacker(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", ATTACKER, "--", *argv], check=True, **kw)


@pytest.mark.parametrize("mode", [0o755, 0o777])
def test_a_root_another_user_made_first_is_refused(lab: Lab, attacker: Path, mode: int, plain: str) -> None:
    root = attacker / "gpu-train"
    mark = attacker / "ran-as-victim"
    as_attacker("mkdir", "-p", str(root / "bin"))
    planted = root / "bin" / "gpu-train-agent"
    as_attacker("sh", "-c", f"printf '#!/bin/sh\\ntouch {mark}\\n' > {planted}; chmod 777 {planted} {root / 'bin'}; chmod {mode:o} {root}")
    stack = lab.stacks / "Pulumi.lab.yaml"
    stack.write_text(stack.read_text().replace(str(lab.remote), str(root)))
    for args in (["train", "--dir", plain, "--command", "true"], ["status"], ["resume"], ["setup"]):
        result = lab.fab(*args)
        assert result.returncode != 0 and f"remoteRoot {root} belongs to {ATTACKER}" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert not mark.exists()
    assert {p.owner() for p in root.rglob("*")} == {ATTACKER}  # nothing of ours was written there


def test_a_symlinked_or_open_root_is_refused(lab: Lab, attacker: Path) -> None:
    target = attacker / "elsewhere"
    target.mkdir()
    link = attacker / "link"
    link.symlink_to(target)
    open_root = attacker / "open"
    open_root.mkdir(mode=0o777)
    open_root.chmod(0o777)
    for root, words in ((link, "is a symbolic link"), (open_root, "writable by group or others")):
        stack = lab.stacks / "Pulumi.lab.yaml"
        stack.write_text(stack.read_text().replace(str(lab.remote), str(root)))
        lab.remote = root
        result = lab.fab("status")
        assert result.returncode != 0 and words in result.stderr, result.stderr
    assert not list(target.iterdir()) and not list(open_root.iterdir())


def test_secrets_never_on_a_command_line_and_runs_are_private(lab: Lab, attacker: Path, plain: str) -> None:
    secret = "s3cr3t-" + os.urandom(8).hex()
    work = attacker / "scan"
    work.mkdir()
    work.chmod(0o777)
    (work / "scan.py").write_text(SCANNER)
    stop, out = work / "stop", work / "hits"
    (work / "secret").write_text(secret)  # not on the scanner's own command line
    scanner = subprocess.Popen(
        ["runuser", "-u", ATTACKER, "--", "/usr/bin/python3", str(work / "scan.py"), str(work / "secret"), str(out), str(stop)]
    )
    try:
        started = run_fab(
            {**lab.env, "WANDB_API_KEY": secret},
            lab.cwd,
            "train",
            "--dir",
            plain,
            "--command",
            'printf %s "$WANDB_API_KEY" | sha256sum > "$JOB_DIR/h"; sleep 1',
            "--env",
            "WANDB_API_KEY",
            "--name",
            "secret",
            check=True,
        )
        run = started.stdout.split()[1]
        assert lab.wait(run)["state"] == "succeeded"
        job_hash = (lab.remote / "runs" / run / "job" / "h").read_text().split()[0]
        assert job_hash == hashlib.sha256(secret.encode()).hexdigest()  # the job got it
    finally:
        stop.touch()
        scanner.wait(timeout=30)
    assert out.exists(), f"the scanner ended ({scanner.returncode}) without writing what it saw"
    # No process showed the secret in its command line: not the host's, and not the laptop's `fab train
    # --env WANDB_API_KEY` (the value comes from its environment), which shares this machine in the test.
    assert out.read_text().splitlines() == []
    run_dir = lab.remote / "runs" / run
    assert stat.S_IMODE(lab.remote.stat().st_mode) == 0o700
    for path in (run_dir / "spec.json", run_dir / "log", run_dir / "state.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert secret not in (lab.remote / "agent.log").read_text() if (lab.remote / "agent.log").exists() else True


@pytest.mark.parametrize("how", ["sticky", "linked"])
def test_a_root_under_another_users_folder_is_refused(lab: Lab, attacker: Path, how: str) -> None:
    # The owner of a sticky folder may rename anything in it: a root the victim made under the
    # attacker's 1777 folder was swapped, and the crontab line `setup` wrote ran the attacker's agent
    # as the victim (issue 28 O). A link to such a place is the same place.
    theirs = attacker / "theirs"
    as_attacker("mkdir", "-m", "1777", str(theirs))
    mine = theirs / "victim"
    mine.mkdir(mode=0o700)  # the victim's own folder, in the attacker's
    if how == "sticky":
        root = mine / "gpu-train"
    else:
        (lab.tmp / "link").symlink_to(mine)
        root = lab.tmp / "link" / "gpu-train"
    stack = lab.stacks / "Pulumi.lab.yaml"
    stack.write_text(stack.read_text().replace(str(lab.remote), str(root)))
    for args in (["status"], ["setup"]):
        result = lab.fab(*args)
        assert result.returncode != 0 and f"{theirs}, which belongs to {ATTACKER}" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr + result.stdout
    assert not list(mine.iterdir())


def test_a_projects_state_another_user_owns_is_not_trusted(lab: Lab, attacker: Path) -> None:
    # The project's .gpu-train/ holds the stack's cached addresses (GCP outputs) and pinned host keys:
    # in a shared lab folder, its owner could point the victim's tasks, code and --env secrets at their host.
    theirs = attacker / "state"
    as_attacker("mkdir", "-p", str(theirs / "lab"))
    result = run_fab({**lab.env, "GPU_TRAIN_HOME": str(theirs)}, lab.cwd, "status")
    assert result.returncode == 2 and f"{theirs} belongs to uid" in result.stderr, result.stderr
    assert "GPU_TRAIN_HOME" in result.stderr and not lab.remote.exists()


def test_a_root_through_another_users_link_is_refused(lab: Lab, attacker: Path) -> None:
    # The attacker's link in a sticky folder (/tmp, /scratch) to a folder of the victim's: every folder
    # it leads to is the victim's or root's, but the link is the attacker's, and the sticky bit lets an
    # entry's owner replace it. Once the victim's root was made through it, the attacker points it at
    # a tree of theirs, and the crontab line `setup` wrote (REMOTE_ROOT/bin/gpu-train-agent) runs theirs.
    mine = lab.tmp / "victims"
    mine.mkdir(mode=0o700)
    link = attacker / "scratch"
    as_attacker("ln", "-s", str(mine), str(link))
    root = link / "gpu-train"
    stack = lab.stacks / "Pulumi.lab.yaml"
    stack.write_text(stack.read_text().replace(str(lab.remote), str(root)))
    for args in (["status"], ["setup"]):
        result = lab.fab(*args)
        assert result.returncode != 0 and f"{link}, which is a symbolic link that belongs to {ATTACKER}" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr + result.stdout
    assert not list(mine.iterdir())


def test_a_state_folder_committed_to_git_is_not_trusted(lab: Lab) -> None:
    # .gpu-train/ is git-ignored, and git replaces ignored files without a word: a commit that adds
    # .gpu-train/STACK/outputs.json (a GCP VM's address) and known_hosts (its key, pinned), pulled or
    # cloned, sends the victim's code and --env secrets to the committer's host (issue 28's threat model:
    # anything in the project tree).
    project = lab.cwd
    state = project / ".gpu-train"
    (state / "lab").mkdir(parents=True)
    (state / "lab" / "known_hosts").write_text("# pinned by a commit\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=project, check=True)
    subprocess.run([*git, "add", "-f", ".gpu-train"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "cache"], cwd=project, check=True)
    result = run_fab({**lab.env, "GPU_TRAIN_HOME": str(state)}, lab.cwd, "status")
    assert result.returncode == 2 and f"{state} holds files committed to git (lab/known_hosts)" in result.stderr, result.stderr
    assert "git rm -r --cached" in result.stderr and not lab.remote.exists()
    subprocess.run([*git, "rm", "-rq", "--cached", ".gpu-train"], cwd=project, check=True)
    (state / "lab" / "known_hosts").unlink()
    assert run_fab({**lab.env, "GPU_TRAIN_HOME": str(state)}, lab.cwd, "status").returncode == 0
