"""A run's results wherever the job writes them, all of them home before anything is destroyed.

Real projects write checkpoints to their own ``out_dir`` under their working directory, not JOB_DIR:
`status` lists what the job wrote there, `fetch` brings it to runs/STACK/RUN/workdir/, and `down`
refuses while anything of any node is not home (a file the host cannot read, something in the way
here), naming it. A fetch that replaces a local file of other content keeps the previous one. Through
the real `fab`, against real sshds on loopback.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from remote.loopback import Sshd
from tests.conftest import Lab, after_the_second_of, cluster_stack, fab_env, run_fab

LAB_ADDRESS = "127.0.26.2"  # this module's loopback addresses: 127.0.26.x (the `lab` fixture reads it)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# The job of a project that does not know gpu-train: a checkpoint in its own out/, a code file it
# appends to; and what is not its output: a venv, compiled modules, a link into the pushed data.
JOB = (
    "mkdir -p out .venv/lib __pycache__ && head -c 300000 /dev/urandom > out/ckpt.pt && echo appended >> README "
    '&& touch .venv/pyvenv.cfg .venv/lib/site.py __pycache__/m.cpython-311.pyc && mkdir -p "$DATA_DIR" '
    '&& ln -s "$DATA_DIR/train.bin" train.bin && echo job > "$JOB_DIR/metrics.txt"'
)


def test_outputs_in_the_working_directory_are_listed_fetched_and_guarded(lab: Lab, plain: str) -> None:
    run = lab.train("--dir", plain, "--command", JOB, "--name", "own")
    assert lab.wait(run)["state"] == "succeeded", lab.log(run)
    code = lab.remote / "runs" / run / "code"
    [r] = [r for r in lab.status()["runs"] if r["id"] == run]
    readme = (code / "README").stat().st_size
    assert r["workdirSummary"]["files"] == 2 and r["workdirSummary"]["bytes"] == 300000 + readme  # ckpt, README
    assert r["workdirSummary"]["newestNs"] == max((code / p).stat().st_mtime_ns for p in ("out/ckpt.pt", "README"))
    assert "(2 in workdir)" in lab.fab("status", check=True).stdout

    dest = lab.cwd / "runs" / "lab" / run
    (dest / "workdir").mkdir(parents=True)
    (dest / "workdir" / "out").write_text("a file where the host has a folder")
    refused = lab.fab("down")
    assert refused.returncode == 1 and "refusing: not everything is home" in refused.stderr
    assert f"{run}: something else is in the way here: out" in refused.stderr and "down --force" in refused.stderr
    assert (dest / "metrics.txt").read_text() == "job\n"  # what could come home did
    again = lab.fab("fetch", "--run", run)
    assert again.returncode == 1 and "something else is in the way here: out" in again.stderr

    (dest / "workdir" / "out").unlink()
    done = lab.fab("down", check=True)
    assert "nothing to destroy" in done.stdout
    assert sha256(dest / "workdir" / "out" / "ckpt.pt") == sha256(code / "out" / "ckpt.pt")
    assert (dest / "workdir" / "README").read_bytes() == (code / "README").read_bytes()
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == [
        ".gpu-train",
        ".gpu-train/log",  # the run's log
        "metrics.txt",
        "workdir",
        "workdir/README",
        "workdir/out",
        "workdir/out/ckpt.pt",
    ]  # no venv, pyc, data link
    fetched = lab.fab("fetch", "--run", run, check=True)
    assert f"{run}: up to date" in fetched.stderr


def test_a_first_fetch_of_working_directory_outputs_alone_is_not_called_up_to_date(lab: Lab, plain: str) -> None:
    """A Lightning or nanoGPT job writes only in its working directory: its empty JOB_DIR is no news. The first
    fetch said "RUN: up to date in runs/lab/RUN" above "fetched 1 file(s)" and "0 up to date"."""
    run = lab.train("--dir", plain, "--command", "mkdir -p out && head -c 1000 /dev/urandom > out/ckpt.pt", "--name", "wd")
    assert lab.wait(run)["state"] == "succeeded", lab.log(run)
    first = lab.fab("fetch", "--run", run, check=True)
    assert f"{run} working directory's outputs: fetched 1 file(s)" in first.stderr, first.stderr
    assert f"{run}: up to date" not in first.stderr, first.stderr
    again = lab.fab("fetch", "--run", run, check=True)
    assert f"{run}: up to date" in again.stderr, again.stderr


@pytest.fixture
def blind_lab(tmp_path: Path):
    """A lab whose sshd (root here) and everything under it cannot bypass file modes: a file of mode 000
    is unreadable to the host's login user, as it is to any user but root (a job's root-owned output)."""
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux)")
    lab = Lab(tmp_path, "127.0.26.3")
    lab.sshd.stop()
    lab.sshd.prefix = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--")
    lab.sshd.start()
    yield lab
    lab.sshd.stop()
    for p in (lab.remote / "runs").rglob("*"):  # pytest removes tmp_path as root: fine; modes back for a look
        if not p.is_symlink():
            p.chmod(0o755)


def test_what_the_host_cannot_read_fails_the_fetch_and_stops_down(blind_lab: Lab, plain: str) -> None:
    lab = blind_lab
    job = (
        "mkdir -p out locked && echo ok > out/ok.pt && echo secret > out/secret.pt && chmod 000 out/secret.pt "
        '&& echo inside > locked/inside && chmod 000 locked && echo hidden > "$JOB_DIR/hidden.bin" '
        '&& chmod 000 "$JOB_DIR/hidden.bin" && echo fine > "$JOB_DIR/fine.txt"'
    )
    run = lab.train("--dir", plain, "--command", job, "--name", "blind")
    assert lab.wait(run)["state"] == "succeeded", lab.log(run)
    fetch = lab.fab("fetch", "--run", run)
    assert fetch.returncode == 1, fetch.stderr
    for what in ("hidden.bin (Permission denied)", "out/secret.pt (Permission denied)", "locked (Permission denied)"):
        assert f"{run}: unreadable on the host: {what}" in fetch.stderr, fetch.stderr
    assert "changed on the host while being read" not in fetch.stderr
    dest = lab.cwd / "runs" / "lab" / run
    assert (dest / "fine.txt").read_text() == "fine\n" and (dest / "workdir" / "out" / "ok.pt").read_text() == "ok\n"
    assert lab.fab("fetch", "--run", run).returncode == 1  # not "up to date" the second time

    refused = lab.fab("down")
    assert refused.returncode == 1 and "out/secret.pt" in refused.stderr and "hidden.bin" in refused.stderr
    for p in (
        lab.remote / "runs" / run / "job" / "hidden.bin",
        lab.remote / "runs" / run / "code" / "locked",
        lab.remote / "runs" / run / "code" / "out" / "secret.pt",
    ):
        p.chmod(0o755)
    lab.fab("down", check=True)
    assert (dest / "hidden.bin").read_text() == "hidden\n" and (dest / "workdir" / "locked" / "inside").read_text() == "inside\n"
    assert (dest / "workdir" / "out" / "secret.pt").read_text() == "secret\n"


def test_a_fetch_that_replaces_a_changed_local_file_keeps_the_old_one(lab: Lab, plain: str) -> None:
    run = lab.train("--dir", plain, "--command", 'mkdir -p out && echo "step 500" > out/ckpt.pt && echo a > log.txt', "--name", "keep")
    lab.wait(run)
    lab.fab("fetch", check=True)
    dest = lab.cwd / "runs" / "lab" / run
    ckpt = lab.remote / "runs" / run / "code" / "out" / "ckpt.pt"
    assert (dest / "workdir" / "out" / "ckpt.pt").read_text() == "step 500\n"
    ckpt.write_text("step 10 of a fresh start\n")  # a relaunch that started over and overwrote it
    with (lab.remote / "runs" / run / "code" / "log.txt").open("a") as f:
        f.write("b\n")  # grew: nothing of the laptop's copy is lost
    later = time.time() + 5
    os.utime(ckpt, (later, later))
    out = lab.fab("fetch", check=True)
    assert (dest / "workdir" / "out" / "ckpt.pt").read_text() == "step 10 of a fresh start\n"
    assert (dest / ".previous" / "workdir" / "out" / "ckpt.pt").read_text() == "step 500\n"
    assert not (dest / ".previous" / "workdir" / "log.txt").exists()
    assert "previous content is kept" in out.stderr and "out/ckpt.pt" in out.stderr
    ckpt.write_text("step 20\n")
    os.utime(ckpt, (later + 5, later + 5))
    lab.fab("fetch", check=True)
    assert (dest / ".previous" / "workdir" / "out" / "ckpt.pt").read_text() == "step 10 of a fresh start\n"  # one each


class Duo:
    """Two nodes, each its own sshd and REMOTE_ROOT (node N's in ``tmp/nodeN``)."""

    def __init__(self, tmp: Path):
        self.a = Sshd(tmp / "a", "127.0.26.4").start()
        self.b = Sshd(tmp / "b", "127.0.26.5", client_key=self.a.client_key).start()
        self.roots = [tmp / "node0", tmp / "node1"]
        cluster_stack(tmp / "stacks", "duo", [self.a.spec, self.b.spec], self.a.client_key)
        self.cwd = tmp / "work"
        self.cwd.mkdir()
        self.env = fab_env(tmp / "stacks", tmp / "home", "duo", self.cwd)

    def fab(self, *args: str, check: bool = False):
        return run_fab(self.env, self.cwd, *args, check=check, timeout=300)


@pytest.fixture
def pair(tmp_path: Path):
    duo = Duo(tmp_path)
    yield duo
    duo.a.stop()
    duo.b.stop()


def test_down_fetches_every_nodes_outputs(pair: Duo, plain: str) -> None:
    cmd = 'mkdir -p out && echo "rank $NODE_RANK" > out/rank.txt && echo "job of $NODE_RANK" > "$JOB_DIR/shard.txt"'
    run = pair.fab("train", "--dir", plain, "--command", cmd, "--name", "ranks", "--ps", "0", check=True).stdout.split()[1]
    deadline = time.monotonic() + 60
    while not all(json.loads((r / "runs" / run / "state.json").read_text()).get("state") == "succeeded" for r in pair.roots):
        assert time.monotonic() < deadline, "the nodes did not finish"
        time.sleep(0.2)
    one = pair.fab("fetch", "--node", "1", check=True)
    dest = pair.cwd / "runs" / "duo" / run
    assert (dest / "node-1" / "workdir" / "out" / "rank.txt").read_text() == "rank 1\n", one.stderr
    assert not (dest / "shard.txt").exists()  # node 0's not asked for
    (dest / "node-1" / "shard.txt").unlink()
    pair.fab("down", check=True)
    assert (dest / "workdir" / "out" / "rank.txt").read_text() == "rank 0\n"
    assert (dest / "shard.txt").read_text() == "job of 0\n" and (dest / "node-1" / "shard.txt").read_text() == "job of 1\n"
    assert (dest / "node-1" / "workdir" / "out" / "rank.txt").read_text() == "rank 1\n"
    for node, root in (("", pair.roots[0]), ("node-1", pair.roots[1])):  # each node's own log, beside its files
        assert (dest / node / ".gpu-train" / "log").read_bytes() == (root / "runs" / run / "log").read_bytes()


def test_unchanged_code_is_staged_as_sent_not_as_the_last_job_left_it(lab: Lab) -> None:
    code = lab.tmp / "project"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    (code / "conf").mkdir()
    (code / "conf" / "base.yaml").write_text("lr: 1\n")
    job = 'cat conf/base.yaml; ls out 2>/dev/null | sed "s/^/FOUND /"; mkdir -p out && echo ckpt > out/ckpt.pt'

    runs: list[str] = []

    def train(said: str) -> str:
        if runs:
            after_the_second_of(runs[-1])  # a new second: a new run id
        result = lab.fab("train", "--dir", str(code), "--command", job, "--name", "same", check=True)
        assert said in result.stderr
        runs.append(result.stdout.split()[1])
        lab.wait(runs[-1])
        return runs[-1]

    train("syncing")
    second = train("unchanged since the last run")
    assert "FOUND ckpt.pt" not in lab.log(second) and "lr: 1" in lab.log(second)  # the first run's checkpoint stays its own
    # A job that changed a file it was sent: the next run gets the laptop's copy, synced again.
    with (lab.remote / "runs" / second / "code" / "conf" / "base.yaml").open("a") as f:
        f.write("changed by the job\n")
    third = train("unchanged since the last run")  # the laptop's claim; the host checks it and asks for the code
    assert (lab.remote / "runs" / third / "code" / "conf" / "base.yaml").read_text() == "lr: 1\n"
    assert [r["workdirSummary"]["files"] for r in lab.status()["runs"] if r["id"] == third] == [1]  # out/ckpt.pt


def test_a_name_this_laptop_cannot_store_is_named_and_the_rest_arrives(host, tmp_path: Path) -> None:
    """The laptop's folder is deeper than the host's: a path that fits there is too long here (PATH_MAX)."""
    job = host.job()
    deep = "/".join(["d" * 200] * 12)
    (job / deep).mkdir(parents=True)
    (job / deep / "ckpt.pt").write_text("x")
    (job / "fine.txt").write_text("ok")
    dest = tmp_path / "/".join(["h" * 200] * 9)
    result = host.fetch(dest)
    assert not result.complete and result.error is None
    assert any(p.startswith(f"{deep}/ckpt.pt (") and "too long" in p for p in result.unstorable), result.unstorable
    assert any("a name this laptop cannot store" in m for m in result.missing())
    assert (dest / "fine.txt").read_text() == "ok"


def test_what_the_job_writes_through_a_pushed_folder_comes_home(lab: Lab) -> None:
    """A pushed folder the code does not have is one link into DATA_DIR, so a job writing its
    checkpoints there writes into the pushed data: those files are outputs all the same (listed,
    fetched to workdir/, guarded by down); a pushed file rewritten through its link is named."""
    project = lab.cwd
    (project / "checkpoints").mkdir()
    (project / "checkpoints" / "pretrained.pt").write_bytes(b"start")
    (project / "weights.bin").write_bytes(b"w0")
    (project / ".gputrainignore").write_text("checkpoints/\nweights.bin\n")
    (project / "job.sh").write_text("echo step > checkpoints/step1.pt\n")
    lab.fab("push", "checkpoints", check=True)
    run = lab.train("--command", "bash job.sh", "--name", "through")
    assert lab.wait(run)["state"] == "succeeded", lab.log(run)
    code = lab.remote / "runs" / run / "code"
    assert (code / "checkpoints").is_symlink()  # written through the link, into DATA_DIR
    [r] = [r for r in lab.status()["runs"] if r["id"] == run]
    assert r["workdirSummary"]["files"] == 1, r  # step1.pt, not the pushed pretrained.pt
    dest = lab.cwd / "runs" / "lab" / run
    (dest / "workdir").mkdir(parents=True)
    (dest / "workdir" / "checkpoints").write_text("in the way")
    refused = lab.fab("down")
    assert refused.returncode == 1 and "checkpoints" in refused.stderr
    (dest / "workdir" / "checkpoints").unlink()
    lab.fab("down", check=True)
    assert (dest / "workdir" / "checkpoints" / "step1.pt").read_text() == "step\n"
    assert not (dest / "workdir" / "checkpoints" / "pretrained.pt").exists()
