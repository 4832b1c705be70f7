"""A stack with a bucket, end to end: real sshd on loopback, the real agent and uploader, and a real
Cloud Storage emulator found by STORAGE_EMULATOR_HOST on both sides (the host's login session has it)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Lab, fab_env, project_id, run_fab
from tests.gcs import Emulator, area

LAB_ADDRESS = "127.0.0.61"
# Three checkpoints 7 s apart, each written in two steps (a half-written file must not be taken), then a last
# file, and one in the working directory (a project's own out_dir).
JOB = (
    'for i in 1 2 3; do head -c 150000 /dev/urandom > "$JOB_DIR/ckpt-$i.pt"; sleep 1; '
    'head -c 150000 /dev/urandom >> "$JOB_DIR/ckpt-$i.pt"; sleep 6; done; '
    'mkdir -p "$JOB_DIR/eval" out; echo done > "$JOB_DIR/eval/final.txt"; echo weights > out/model.pt'
)


@pytest.fixture
def bucket_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    emu = Emulator("ckpt", tmp_path / "emulator.log")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.url)  # the laptop's side
    lab = Lab(tmp_path, LAB_ADDRESS, setenv=f"STORAGE_EMULATOR_HOST={emu.url}")  # the host's login sessions
    stack = lab.stacks / "Pulumi.lab.yaml"
    stack.write_text(stack.read_text() + "  gpu-train:bucket: gs://ckpt/team\n")
    yield lab, emu
    lab.sshd.stop()
    emu.stop()


def test_checkpoints_reach_the_bucket_while_training_and_come_home_without_the_host(bucket_lab, plain: str) -> None:
    lab, emu = bucket_lab
    run = lab.train("--command", JOB, "--dir", plain)
    prefix = f"team/.gpu-train-runs/{area(lab.stacks / 'Pulumi.lab.yaml')}/{run}/"
    deadline = time.monotonic() + 40
    while f"{prefix}ckpt-1.pt" not in (seen := emu.objects(prefix)):
        assert time.monotonic() < deadline, f"nothing in the bucket while training; upload.log: {lab.log(run)}"
        time.sleep(0.5)
    assert lab.run_state(run)["state"] == "running"  # in the bucket *during* training
    assert len(seen[f"{prefix}ckpt-1.pt"]) == 300000  # complete, never the first half
    refused = lab.fab("down", "--no-fetch")
    assert refused.returncode != 0 and f"still running: {run}" in refused.stderr

    done = lab.wait(run, timeout=60)
    assert done["state"] == "succeeded", lab.log(run)
    job_dir = lab.remote / "runs" / run / "job"
    host_files = {p.relative_to(job_dir).as_posix(): p.read_bytes() for p in job_dir.rglob("*") if p.is_file()}
    host_files["workdir/out/model.pt"] = (lab.remote / "runs" / run / "code" / "out" / "model.pt").read_bytes()
    host_files[".gpu-train/log"] = (lab.remote / "runs" / run / "log").read_bytes()  # the run's log, as it ends
    assert set(host_files) == {"ckpt-1.pt", "ckpt-2.pt", "ckpt-3.pt", "eval/final.txt", "workdir/out/model.pt", ".gpu-train/log"}
    assert emu.objects(prefix) == {prefix + rel: data for rel, data in host_files.items()}  # the last upload too
    bucket = done["bucket"]
    assert bucket["final"] and bucket["onlyHost"] == [] and bucket["files"] == 6
    assert bucket["url"] == f"gs://ckpt/{prefix}"
    shown = lab.fab("status", check=True).stdout
    assert f"{run}: 6 file(s) in gs://ckpt/{prefix} (verified); nothing only on the host" in shown

    (job_dir / "late.txt").write_text("written after the run")  # only on the host: down --no-fetch refuses
    refused = lab.fab("down", "--no-fetch")
    assert refused.returncode != 0 and f"{run}: only on the host: late.txt" in refused.stderr, refused.stderr
    (job_dir / "late.txt").unlink()
    log, was = lab.remote / "runs" / run / "log", (lab.remote / "runs" / run / "log").stat()
    with log.open("a") as f:  # the run's log is a result too: a line the bucket lacks is only on the host
        f.write("a line after the last upload\n")
    refused = lab.fab("down", "--no-fetch")
    assert refused.returncode != 0 and f"{run}: only on the host: .gpu-train/log" in refused.stderr, refused.stderr
    os.truncate(log, was.st_size)
    os.utime(log, ns=(was.st_atime_ns, was.st_mtime_ns))
    gone = lab.fab("down", "--no-fetch", check=True)
    assert "every run is verified in gs://ckpt/team; nothing downloaded" in gone.stderr
    assert not (lab.cwd / "runs").exists()  # nothing came home

    shutil.rmtree(lab.remote)  # the host's REMOTE_ROOT is gone
    home = lab.cwd / "runs" / "lab" / run
    got = lab.fab("fetch", "--from", "bucket", "--run", run, check=True)
    assert "6 file(s)" in got.stderr, got.stderr
    assert {p.relative_to(home).as_posix(): p.read_bytes() for p in home.rglob("*") if p.is_file()} == host_files

    (home / "ckpt-2.pt").write_bytes(b"damaged")  # a local copy that differs, older than the bucket's, is replaced
    os.utime(home / "ckpt-2.pt", (time.time() - 3600, time.time() - 3600))  # (one newer than it is kept, as the host fetch keeps it)
    # And now the host cannot be reached at all: the stack names a port nothing listens on (stopping the
    # lab's sshd would leave the connections it already serves, and the tasks' shared ones, up).
    from remote.loopback import free_port

    stack = lab.stacks / "Pulumi.lab.yaml"
    stack.write_text(stack.read_text().replace(f":{lab.sshd.port}'", f":{free_port(lab.sshd.address)}'"))
    got = lab.fab("fetch", "--run", run)
    assert got.returncode == 0, got.stderr
    assert "cannot be reached: fetching from the bucket" in got.stderr and "1 file(s)" in got.stderr
    assert "5 unchanged" in got.stderr
    assert (home / "ckpt-2.pt").read_bytes() == host_files["ckpt-2.pt"]
    assert (home / ".previous" / "ckpt-2.pt").read_bytes() == b"damaged"  # the replaced copy kept
    assert not list(home.parent.glob(".*partial*"))


def test_down_no_fetch_asks_the_bucket_itself_for_every_recorded_file(bucket_lab, plain: str) -> None:
    """With the run's objects deleted from the bucket (any VM with the grant, a lifecycle rule, a person),
    `down --no-fetch` believed the host's record, said "every run is verified" and destroyed."""
    lab, emu = bucket_lab
    run = lab.train("--command", 'echo a > "$JOB_DIR/a.txt"; echo b > "$JOB_DIR/b.txt"', "--dir", plain)
    done = lab.wait(run, timeout=60)
    assert done["state"] == "succeeded" and done["bucket"]["final"] and done["bucket"]["onlyHost"] == [], lab.log(run)
    bucket = emu.client().bucket("ckpt")
    prefix = f"team/.gpu-train-runs/{area(lab.stacks / 'Pulumi.lab.yaml')}/{run}/"
    bucket.blob(f"{prefix}b.txt").delete()
    refused = lab.fab("down", "--no-fetch")
    assert refused.returncode != 0 and f"{run}: not in the bucket: {prefix}b.txt" in refused.stderr, refused.stderr
    bucket.blob(f"{prefix}b.txt").upload_from_string(b"b\n")  # the same bytes, but not the version verified
    bucket.blob(f"{prefix}a.txt").upload_from_string(b"overwritten\n")
    refused = lab.fab("down", "--no-fetch")
    again = f"{run}: another version in the bucket: {prefix}a.txt"
    assert refused.returncode != 0 and again in refused.stderr, refused.stderr
    assert f"{prefix}b.txt" in refused.stderr
    assert (lab.remote / "runs" / run / "job" / "a.txt").read_text() == "a\n"  # nothing was destroyed or released


def test_outputs_behind_a_link_out_of_the_run_stop_both_downs(bucket_lab, plain: str, tmp_path: Path) -> None:
    """A checkpoint folder linked to a scratch disk: neither the uploader nor either `down` counted it."""
    lab, _ = bucket_lab
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    run = lab.train(
        "--command", f'mkdir -p {scratch}/ckpt && echo w > {scratch}/ckpt/step1.pt && ln -s {scratch}/ckpt "$JOB_DIR/ckpt"', "--dir", plain
    )
    done = lab.wait(run, timeout=60)
    assert done["state"] == "succeeded", lab.log(run)
    # The link is named; the run's log is also not home: the wrapper wrote the uploader's failure (it could
    # not make the run complete) into it after the last pass.
    assert [o.split(" (")[0] for o in done["bucket"]["onlyHost"]] == [".gpu-train/log", "ckpt"], lab.log(run)
    assert "the bucket upload ended with exit 1" in lab.log(run) and done["bucket"]["final"] is False
    refused = lab.fab("down", "--no-fetch")
    both = f"{run}: only on the host: .gpu-train/log, ckpt (a link out of the run"
    assert refused.returncode != 0 and both in refused.stderr, refused.stderr
    refused = lab.fab("down")
    assert refused.returncode != 0 and f"{run}: a link out of the run, what it points to is not home: ckpt" in refused.stderr, (
        refused.stderr
    )


def test_data_pushed_to_the_bucket_is_on_local_disk_before_the_job_starts(bucket_lab, plain: str) -> None:
    """And only what this laptop pushed: objects another writer of the bucket planted under the data's
    prefix (a `numpy.py` beside the data, a file inside it) never reach the host or the working directory."""
    lab, emu = bucket_lab
    pid = project_id(lab.home, lab.cwd)  # the project's id (work-XXXXXXXX): two users' clones never share data
    planted = emu.client().bucket("ckpt")
    planted.blob(f"team/.gpu-train-data/{pid}/numpy.py").upload_from_string(b"raise SystemExit('planted')")
    planted.blob("team/data/work/numpy.py").upload_from_string(b"raise SystemExit('planted')")  # the old place
    no_push = lab.train("--command", 'test ! -e numpy.py && test -z "$(ls -A "$DATA_DIR" 2>/dev/null)"', "--dir", plain)
    assert lab.wait(no_push, timeout=60)["state"] == "succeeded", lab.log(no_push)  # no manifest, no pull
    data = lab.cwd / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("hello from the bucket\n")
    (data / "sub" / "b.bin").write_bytes(os.urandom(300000))
    sent = lab.fab("push", "data", "--to", "bucket", check=True).stdout
    assert "2 file(s)" in sent and f"gs://ckpt/team/.gpu-train-data/{pid}/data/" in sent
    assert "0 file(s)" in lab.fab("push", "data", "--to", "bucket", check=True).stdout  # incremental
    planted.blob(f"team/.gpu-train-data/{pid}/data/planted.txt").upload_from_string(b"not the user's")
    run = lab.train(
        "--command",
        'cat "$DATA_DIR/data/a.txt" > "$JOB_DIR/seen.txt" && '
        'test ! -L "$DATA_DIR/data/sub/b.bin" && cmp data/sub/b.bin "$DATA_DIR/data/sub/b.bin" && '
        "test ! -e numpy.py && test ! -e data/planted.txt && "
        'echo same >> "$JOB_DIR/seen.txt"',
        "--dir",
        plain,
    )
    assert lab.wait(run, timeout=60)["state"] == "succeeded", lab.log(run)
    assert (lab.remote / "runs" / run / "job" / "seen.txt").read_text() == "hello from the bucket\nsame\n"
    assert (lab.remote / "data").is_dir()  # on the host's own disk
    assert sorted(p.name for p in (lab.remote / "data" / pid).rglob("*") if p.is_file()) == ["a.txt", "b.bin"]

    planted.blob(f"team/.gpu-train-data/{pid}/data/a.txt").upload_from_string(b"replaced\n")  # after the push
    (lab.remote / "data" / pid / "data" / "a.txt").unlink()
    run = lab.train("--command", "true", "--dir", plain)
    done = lab.wait(run, timeout=60)
    assert done["state"] == "failed" and "copying the project's data from the bucket failed" in lab.log(run)


def _freeze(pid: int, sig: int) -> None:
    """``sig`` to an sshd and every process under it (its sessions: the shared connection's server side)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo = [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def test_a_host_that_vanishes_falls_back_to_the_bucket_at_once(bucket_lab, plain: str) -> None:
    """A host gone silent (its sshd and sessions frozen: packets go unanswered, as a deleted VM's) leaves the
    tasks' shared connection up until its keepalive gives up (15 s); fetch finds it in one round trip and
    turns to the bucket. --watch and --all-nodes turn to it too (--watch saying why it does not watch)."""
    lab, _ = bucket_lab
    run = lab.train("--command", 'head -c 200000 /dev/urandom > "$JOB_DIR/ckpt.pt"', "--dir", plain)
    assert lab.wait(run, timeout=60)["state"] == "succeeded", lab.log(run)
    assert lab.run_state(run)["bucket"]["final"]
    lab.fab("status", check=True)  # the shared connection is up (remote/ssh/mux.py)
    home = lab.cwd / "runs" / "lab" / run
    _freeze(lab.sshd.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        got = lab.fab("fetch", "--run", run, timeout=60)
        took = time.monotonic() - started
    finally:
        _freeze(lab.sshd.proc.pid, signal.SIGCONT)
    assert got.returncode == 0, got.stderr
    assert "did not answer within 5 s" in got.stderr and "cannot be reached: fetching from the bucket" in got.stderr
    assert took < 12, f"{took:.1f} s"  # (the keepalive alone takes 15 s)
    assert (home / "ckpt.pt").read_bytes() == (lab.remote / "runs" / run / "job" / "ckpt.pt").read_bytes()

    from remote.loopback import free_port

    (home / "ckpt.pt").unlink()
    stack = lab.stacks / "Pulumi.lab.yaml"
    stack.write_text(stack.read_text().replace(f":{lab.sshd.port}'", f":{free_port(lab.sshd.address)}'"))
    watched = lab.fab("fetch", "--watch")
    assert watched.returncode == 3, watched.stderr  # UNREACHABLE: fetched, but not watched
    assert "cannot be reached: fetching from the bucket" in watched.stderr and "not watching" in watched.stderr
    assert (home / "ckpt.pt").is_file()
    (home / "ckpt.pt").unlink()
    every = lab.fab("fetch", "--all-nodes")
    assert every.returncode == 0, every.stderr
    assert "every node's files" in every.stderr and (home / "ckpt.pt").is_file()


def test_two_stacks_of_one_name_on_one_bucket_never_share_runs(bucket_lab, plain: str, tmp_path: Path) -> None:
    """Two users' projects on one host, each with its own stack `lab` on gs://ckpt/team: both stacks' runs went
    to PREFIX/.gpu-train-runs/lab/, where each one's `fetch --from bucket` took the other's newest run (and
    either VM's grant covered both). Each stack now has its own area, written into its stack file by its
    first `train`; a run uploaded before areas (in the stack's name's folder) is still fetched."""
    lab, emu = bucket_lab
    before = "train_20250101_000000"  # as an uploader before areas left it
    emu.client().bucket("ckpt").blob(f"team/.gpu-train-runs/lab/{before}/ckpt.pt").upload_from_string(b"from before areas")
    bob = tmp_path / "bob"  # the other user: own folder, laptop state, REMOTE_ROOT and stack file, the same name
    (bob / "work").mkdir(parents=True)
    lab.sshd.stack_file(bob / "stacks", "lab", bob / "remote", sys.executable, "  gpu-train:bucket: gs://ckpt/team\n")

    def bobs(*args: str) -> str:  # what `fab ARGS` said (stdout, stderr) in bob's project
        said = run_fab(fab_env(bob / "stacks", bob / "home", "lab", bob / "work"), bob / "work", *args, check=True)
        return said.stdout + said.stderr

    mine = lab.train("--command", 'echo alice > "$JOB_DIR/who.txt"', "--dir", plain)
    assert lab.wait(mine, timeout=60)["bucket"]["final"], lab.log(mine)
    said = bobs("train", "--command", 'echo bob > "$JOB_DIR/who.txt"', "--dir", plain)
    theirs = said.split("started ", 1)[1].split()[0]
    assert "wrote gpu-train:bucketArea: lab@" in said and "commit it" in said
    record = bob / "remote" / "runs" / theirs / "bucket.json"  # the host's record of what is verified in the bucket
    deadline = time.monotonic() + 60
    while not (record.exists() and json.loads(record.read_text()).get("final")):
        assert time.monotonic() < deadline, "bob's run never finished its last upload"
        time.sleep(0.2)
    a, b = area(lab.stacks / "Pulumi.lab.yaml"), area(bob / "stacks" / "Pulumi.lab.yaml")
    assert a != b and a.startswith("lab@") and b.startswith("lab@")
    assert set(emu.objects(f"team/.gpu-train-runs/{a}/")) == {f"team/.gpu-train-runs/{a}/{mine}/{f}" for f in ("who.txt", ".gpu-train/log")}
    assert set(emu.objects(f"team/.gpu-train-runs/{b}/")) == {
        f"team/.gpu-train-runs/{b}/{theirs}/{f}" for f in ("who.txt", ".gpu-train/log")
    }

    got = lab.fab("fetch", "--from", "bucket", check=True).stderr  # the newest run is its own, not bob's newer one
    assert f"{mine}: 2 file(s)" in got and theirs not in got, got
    assert (lab.cwd / "runs" / "lab" / mine / "who.txt").read_text() == "alice\n"
    got = lab.fab("fetch", "--from", "bucket", "--all", check=True).stderr
    assert theirs not in got and f"{before}: 1 file(s)" in got, got  # (the run from before areas: still reachable)
    assert (lab.cwd / "runs" / "lab" / before / "ckpt.pt").read_bytes() == b"from before areas"
    assert f"{theirs}: 2 file(s)" in bobs("fetch", "--from", "bucket", "--run", theirs)
    assert mine not in bobs("fetch", "--from", "bucket", "--all")
    assert (bob / "work" / "runs" / "lab" / theirs / "who.txt").read_text() == "bob\n"
    assert not (bob / "work" / "runs" / "lab" / mine).exists() and not (lab.cwd / "runs" / "lab" / theirs).exists()
    bobs_stack = bob / "stacks" / "Pulumi.lab.yaml"  # a stack file that lost its area: the error names the areas there
    bobs_stack.write_text("".join(line for line in bobs_stack.read_text().splitlines(True) if "bucketArea" not in line))
    lost = run_fab(fab_env(bob / "stacks", bob / "home", "lab", bob / "work"), bob / "work", "fetch", "--from", "bucket", "--run", theirs)
    assert lost.returncode != 0 and f"other stacks named lab have runs in {', '.join(sorted((a, b)))}" in lost.stderr, lost.stderr
