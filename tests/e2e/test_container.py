"""`train --image` against a real Docker daemon (started by the tests: tests/containers.py), a real sshd
and the real `gpu-train`: the project's code in an image, the image's own program, stop and the
killed client, the pinned digest on resume (a registry with a token: test_container_registry.py). Never a
pull from the internet:
images are `docker import`s of the guest tier's Debian root file system."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests import containers
from tests.conftest import Lab

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("containers")]  # one daemon per module, on one worker
LAB_ADDRESS = "127.0.40.2"
SECRET = "tok-" + hashlib.sha256(str(os.getpid()).encode()).hexdigest()[:24]

TRAIN = r"""import json, os, signal, sys, time
job = os.environ["JOB_DIR"]
def saved(signum, frame):
    time.sleep(3)  # a checkpoint that takes its time: the run's grace must cover it
    open(os.path.join(job, "saved"), "w").write(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, saved)
signal.signal(signal.SIGINT, saved)
st = os.statvfs("/dev/shm")
json.dump({
    "marker": open("/etc/gt-marker").read().strip(),
    "uid": os.getuid(), "cwd": os.getcwd(), "resumes": os.environ.get("GPU_TRAIN_RESUMES"),
    "secret": os.environ.get("SECRET"), "registryToken": os.environ.get("GPU_TRAIN_REGISTRY_TOKEN"),
    "shmBytes": st.f_blocks * st.f_frsize, "home": os.environ.get("HOME"), "args": sys.argv[1:],
}, open(os.path.join(job, "seen-%s.json" % os.environ["GPU_TRAIN_RESUMES"]), "w"))
open("written-in-workdir.txt", "w").write("hi")
print("step 1 loss 0.5", flush=True)
for _ in range(int(os.environ.get("STEPS", "0"))):
    time.sleep(0.1)
"""
PROG = """#!/bin/sh
printf '%s\\n' "$0" "$@" > "$JOB_DIR/argv.txt"
printf '%s\\n' "$GREETING" "$AIP_MODEL_DIR" "$CLUSTER_SPEC" > "$JOB_DIR/env.txt"
cat /etc/gt-marker > "$JOB_DIR/marker.txt"
"""


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory: pytest.TempPathFactory):
    if reason := containers.skip_reason():
        pytest.skip(reason)
    d = containers.Dockerd(tmp_path_factory.mktemp("dockerd")).start()
    # USER 4321: without gpu-train's --user, what the job writes in the mounts would be 4321's
    d.import_rootfs("gt/base:1", ("USER 4321",))
    d.derive("gt/base:1", "gt/job:1", {"/etc/gt-marker": "A"}, ("USER 4321",))
    d.derive("gt/base:1", "gt/job:2", {"/etc/gt-marker": "B"}, ("USER 4321",))
    d.derive(
        "gt/base:1",
        "gt/prog:1",
        {"/usr/local/bin/prog": PROG, "/usr/local/bin/prog2": PROG, "/etc/gt-marker": "P"},
        ('ENTRYPOINT ["/usr/local/bin/prog"]', 'CMD ["--default", "x"]'),
    )
    yield d
    d.stop()


@pytest.fixture
def clab(tmp_path: Path, dockerd: containers.Dockerd):
    lab = Lab(tmp_path, LAB_ADDRESS, setenv=f"DOCKER_HOST={dockerd.host} PATH={Path(containers.DOCKER).parent}:/usr/sbin:/usr/bin:/bin")
    yield lab
    lab.sshd.stop()


def project(lab: Lab) -> Path:
    code = lab.tmp / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(TRAIN)
    return code


def state(lab: Lab, run: str) -> dict:
    return json.loads((lab.remote / "runs" / run / "state.json").read_text())


def wait_for(what, timeout: float = 60, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := what():
            return got
        time.sleep(step)
    raise AssertionError(f"not in {timeout} s: {what}")


def scan_cmdlines(secret: str, stop: threading.Event, hits: list[str]) -> None:
    """Every process's command line, again and again, for ``secret`` (each user reads them in /proc)."""
    while not stop.is_set():
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    args = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if secret.encode() in args:
                    hits.append(args.replace(b"\0", b" ").decode(errors="replace")[:300])
        time.sleep(0.01)


def test_the_projects_code_runs_in_the_image(clab: Lab, dockerd: containers.Dockerd) -> None:
    """The image's files, the code's mounts at the same paths, the user's uid on what it writes, host
    IPC's shared memory, --env-file values by name only (never on a command line), the image pinned."""
    code = project(clab)
    env_file = clab.tmp / "secrets.env"
    env_file.write_text(f"SECRET={SECRET}\n")
    stop, hits = threading.Event(), []
    scanner = threading.Thread(target=scan_cmdlines, args=(SECRET, stop, hits), daemon=True)
    scanner.start()
    try:
        flags = ("--args", "--lr 1", "--env-file", str(env_file), "--env", "STEPS=10")
        run = clab.train("--dir", str(code), "--image", "gt/job:1", "--script", "train.py", *flags)
        assert clab.wait(run)["state"] == "succeeded", clab.log(run)
    finally:
        stop.set()
        scanner.join()
    assert hits == [], f"the secret on a command line: {hits}"
    run_dir = clab.remote / "runs" / run
    seen = json.loads((run_dir / "job" / "seen-0.json").read_text())
    assert seen["marker"] == "A"  # the image's own file
    assert seen["cwd"] == str(run_dir / "code") and seen["args"] == ["--lr", "1"]
    assert seen["uid"] == os.getuid()  # --user: not the image's USER 4321
    assert seen["secret"] == SECRET and seen["home"] == "/tmp"
    assert seen["shmBytes"] > 64 << 20  # host IPC: not the container's 64 MB /dev/shm
    for written in (run_dir / "job" / "seen-0.json", run_dir / "code" / "written-in-workdir.txt"):
        assert written.stat().st_uid == os.getuid()
    log = clab.log(run)
    assert "--env SECRET" in log and SECRET not in log and "step 1 loss 0.5" in log
    image_id = dockerd.out("image", "inspect", "--format", "{{.Id}}", "gt/job:1")
    assert state(clab, run)["imageId"] == image_id
    status = clab.run_state(run)
    assert (status["image"], status["imageId"]) == ("gt/job:1", image_id)
    assert not [n for n in dockerd.names() if run in n]  # --rm: nothing left
    clab.fab("fetch", "--run", run, check=True)  # what it wrote comes home as a plain run's does
    home = clab.cwd / "runs" / "lab" / run
    assert json.loads((home / "seen-0.json").read_text())["marker"] == "A", sorted(p.name for p in home.rglob("*"))
    assert (home / "workdir" / "written-in-workdir.txt").read_text() == "hi"


def test_stop_gives_the_grace_and_removes_a_container_whose_client_was_killed(clab: Lab, dockerd: containers.Dockerd) -> None:
    """The job's own SIGTERM handler gets its time; a killed `docker run` client leaves the container
    running, and `stop` removes it by name; --init passes SIGTERM to a PID 1 with no handler."""
    code = project(clab)
    run = clab.train("--dir", str(code), "--image", "gt/job:1", "--script", "train.py", "--env", "STEPS=6000")
    wait_for(lambda: (clab.remote / "runs" / run / "job" / "seen-0.json").exists())
    said = clab.fab("stop", "--run", run, "--grace", "10", check=True).stdout
    assert (clab.remote / "runs" / run / "job" / "saved").read_text() == "SIGINT"  # its 3 s handler ran to the end
    assert f"{run}: stopped (SIGINT)" in said, said  # within the first grace: no SIGTERM, no SIGKILL needed
    assert clab.run_state(run)["state"] == "stopped"
    assert not [n for n in dockerd.names() if run in n]

    # The image's own program, `sleep` as the container's only process: no handler of its own.
    run = clab.train("--image", "gt/prog:1", "--entrypoint", "sleep 600", "--name", "sleeper")
    # running, not only created: a client killed between the two leaves a container that never starts
    name = wait_for(lambda: next((n for n in dockerd.out("ps", "--format", "{{.Names}}").split() if run in n), None))
    pid = wait_for(lambda: state(clab, run).get("pid"))
    os.kill(pid, signal.SIGKILL)  # the client only
    time.sleep(1)
    assert name in dockerd.out("ps", "--format", "{{.Names}}").split()  # still running, GPUs and all
    started = time.monotonic()
    clab.fab("stop", "--run", run, "--grace", "30", check=True)
    assert name not in dockerd.names()
    assert time.monotonic() - started < 28  # the signal reached sleep through --init: no 30 s wait (a margin for a loaded box)


def test_a_client_killed_between_create_and_start_leaves_no_container(tmp_path: Path, dockerd: containers.Dockerd) -> None:
    """`docker run` is create, attach, start: its client killed before the start (here at the very request,
    which never reaches the daemon) leaves the container created, never started, which --rm never
    removes; the wrapper removes it as the run ends, on any host (no unit's ExecStopPost needed)."""
    found: list[str] = []
    cut = containers.StartCut(
        dockerd, lambda container: found.append(dockerd.out("inspect", "--format", "{{.Name}} {{.State.Status}}", container))
    )
    lab = Lab(tmp_path, "127.0.42.1", setenv=f"DOCKER_HOST={cut.host} PATH={Path(containers.DOCKER).parent}:/usr/sbin:/usr/bin:/bin")
    try:
        run = lab.train("--image", "gt/prog:1", "--entrypoint", "sleep 600", "--name", "cut")
        info = lab.wait(run, timeout=120)
        ((name, status),) = [line.lstrip("/").split() for line in found]
        assert run in name and status == "created"  # the client was killed between the two
        assert cut.killed == state(lab, run)["pid"]  # the run's own client, and no other
        assert info["state"] == "failed" and info["exitCode"] == -9, info
        assert name not in dockerd.names(), dockerd.out("ps", "-a", "--format", "{{.Names}} {{.State}}")
        assert f"the docker client ended (SIGKILL) before the container {name} started: removed it (created)" in lab.log(run)
    finally:
        lab.sshd.stop()
        cut.close()


def test_the_images_own_program_as_vertex_runs_it(clab: Lab, dockerd: containers.Dockerd) -> None:
    """No code sent; --args replace CMD, --entrypoint replaces ENTRYPOINT (and drops CMD)."""
    cases = [
        ((), ["/usr/local/bin/prog", "--default", "x"]),
        (("--args", "--epochs 2"), ["/usr/local/bin/prog", "--epochs", "2"]),
        (("--entrypoint", "/usr/local/bin/prog2 a"), ["/usr/local/bin/prog2", "a"]),
    ]
    for i, (flags, argv) in enumerate(cases):
        run = clab.train("--image", "gt/prog:1", "--name", f"prog{i}", *flags)
        assert clab.wait(run)["state"] == "succeeded", clab.log(run)
        assert (clab.remote / "runs" / run / "job" / "argv.txt").read_text().split("\n")[:-1] == argv
        assert list((clab.remote / "runs" / run / "code").iterdir()) == []  # no code was sent


def test_resume_runs_the_same_image_though_its_tag_moved(clab: Lab, dockerd: containers.Dockerd) -> None:
    code = project(clab)
    dockerd.docker("tag", "gt/job:1", "gt/moving:1")
    run = clab.train("--dir", str(code), "--image", "gt/moving:1", "--script", "train.py", "--resume-args", "--resumed")
    assert clab.wait(run)["state"] == "succeeded", clab.log(run)
    first = state(clab, run)["imageId"]
    dockerd.docker("tag", "gt/job:2", "gt/moving:1")  # the tag now names other content (marker B)
    clab.fab("resume", "--run", run, check=True)
    wait_for(lambda: (clab.remote / "runs" / run / "job" / "seen-1.json").exists())
    assert clab.wait(run)["state"] == "succeeded"
    seen = json.loads((clab.remote / "runs" / run / "job" / "seen-1.json").read_text())
    assert (seen["marker"], seen["resumes"], seen["args"]) == ("A", "1", ["--resumed"])
    assert state(clab, run)["imageId"] == first


def test_a_sweeps_trials_run_in_the_stacks_image(clab: Lab, dockerd: containers.Dockerd) -> None:
    """gpu-train:image holds for each trial of a sweep as for a `train` run (before the sweep shared train's
    launch path, its trials ran on the host), each trial in its own slot's container."""
    stack = clab.stacks / "Pulumi.lab.yaml"
    stack.write_text(stack.read_text() + "  gpu-train:image: gt/job:2\n")
    (clab.cwd / "trial.py").write_text(
        "import os, sys\n"
        "open(os.path.join(os.environ['JOB_DIR'], 'seen'), 'w').write(open('/etc/gt-marker').read().strip() + ' ' + sys.argv[-1])\n"
    )
    out = clab.fab("sweep", "--script", "trial.py", "--name", "img", "--slots", "2", "--values", "v=1,2", check=True).stdout
    assert "img: 2 trials over 2 slot(s); started 2" in out, out
    runs = sorted(p.name for p in (clab.remote / "runs").glob("img_t*"))
    for run in runs:
        wait_for(lambda run=run: state(clab, run).get("state") in ("succeeded", "failed"))
        assert state(clab, run)["state"] == "succeeded", clab.log(run)
        assert state(clab, run)["imageId"] == dockerd.out("image", "inspect", "--format", "{{.Id}}", "gt/job:2").strip()
    assert [(clab.remote / "runs" / r / "job" / "seen").read_text() for r in runs] == ["B 1", "B 2"]  # the image's file


def test_no_engine_is_refused_at_launch_with_the_reason(tmp_path: Path, dockerd: containers.Dockerd) -> None:
    # (and a Podman that does not run: its configuration is missing)
    where = (
        f"DOCKER_HOST=unix://{tmp_path}/no.sock CONTAINERS_CONF={tmp_path}/none.conf PATH={Path(containers.DOCKER).parent}:/usr/bin:/bin"
    )
    lab = Lab(tmp_path, "127.0.40.3", setenv=where)
    try:
        said = lab.fab("train", "--image", "gt/prog:1")
        assert said.returncode != 0 and "Docker is installed but its daemon does not answer" in said.stderr, said.stderr
        assert not (lab.remote / "runs").exists() or not list((lab.remote / "runs").iterdir())
    finally:
        lab.sshd.stop()


def test_a_user_neither_root_nor_in_the_docker_group_is_refused_with_the_reason(dockerd: containers.Dockerd) -> None:
    """The shared host's rule, against the real daemon: a user who may not use its socket gets the reason
    (the docker group is root on the host) and who can do what, from the agent's own engine choice."""
    import shutil
    import subprocess

    if not shutil.which("useradd"):
        pytest.skip("needs useradd")
    user = f"gtnodock{os.getpid()}"
    subprocess.run(["userdel", user], capture_output=True, check=False)
    subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", user], check=True)
    try:
        probe = (
            f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
            "from agent import container\nfrom agent.store import AgentError\n"
            "try:\n    print('engine', container.engine())\nexcept AgentError as e:\n    print(e)\n"
        )
        # (a Podman that does not run for them either: with one, they get it: test_container_podman.py)
        env = {
            "DOCKER_HOST": dockerd.host,
            "PATH": f"{Path(containers.DOCKER).parent}:/usr/bin:/bin",
            "HOME": "/tmp",
            "CONTAINERS_CONF": "/nonexistent",
        }
        said = subprocess.run(
            [shutil.which("runuser") or "/usr/sbin/runuser", "-u", user, "--", "/usr/bin/python3", "-c", probe],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert f"{user} may not use Docker on this host" in said.stdout, (said.stdout, said.stderr)
        assert "membership of that group is root on the host" in said.stdout and "Podman" in said.stdout
    finally:
        subprocess.run(["userdel", user], capture_output=True, check=False)


def test_an_images_own_program_leaves_no_launch_waiting_on_the_host(tmp_path: Path, dockerd: containers.Dockerd) -> None:
    """`train` on the shared connection opens each node's launch while it plans the code (remote/ssh/early.py),
    for code it will send. An image's own program sends none and launches without that call: the early one
    is ended once the launches answered, not left on the host waiting for a spec as long as the task lasts
    (with --follow, the run's life)."""
    lab = Lab(tmp_path, "127.0.46.1", setenv=f"DOCKER_HOST={dockerd.host} PATH={Path(containers.DOCKER).parent}:/usr/sbin:/usr/bin:/bin")
    waiting = b"\0--root\0" + str(lab.remote).encode() + b"\0launch\0-\0--await-go"
    follow = None
    try:
        lab.train("--image", "gt/prog:1", "--name", "warm")  # its login starts the shared connection beside it
        lab.wait(wait_for(lambda: next((d.name for d in (lab.remote / "runs").glob("warm_*")), None)))
        hold = 'echo holding; while [ ! -e "$JOB_DIR/go" ]; do sleep 0.1; done; echo released'
        follow = lab.spawn("train", "--image", "gt/prog:1", "--name", "held", "--follow", "--entrypoint", f"/bin/sh -c '{hold}'")
        assert follow.stdout is not None
        while "holding" not in (line := follow.stdout.readline()):  # the launches answered: the follow streams
            assert line, follow.communicate(timeout=30)
        left = []
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            with contextlib.suppress(OSError):
                if waiting in Path(f"/proc/{pid}/cmdline").read_bytes():
                    left.append(pid)
        (next(d for d in (lab.remote / "runs").glob("held_*")) / "job" / "go").touch()
        out, err = follow.communicate(timeout=60)
        assert follow.returncode == 0 and "released" in out, out + err
        assert left == [], "an early launch still waits for a spec on the host"
    finally:
        if follow is not None and follow.poll() is None:
            follow.kill()
        lab.sshd.stop()
