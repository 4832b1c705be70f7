"""Container runs, the pure parts: `docker run`'s command line, the engine and GPU choices, the image
pinned to its digest, --image's checks, the contract's ContainerSpec, the unit's removal by name.
(tests/e2e/test_container.py runs them against a real dockerd and registry.)"""

from __future__ import annotations

import os
import stat
from typing import Any

import pytest

from agent import container, registry, units
from agent.store import AgentError
from gpu_train import jobs
from gpu_train.contract import ContainerSpec, JobSpec, RunRecord

IMAGE_ID = "sha256:" + "ab" * 32


def argv(c: ContainerSpec, job: list[str], **over: Any) -> list[str]:
    kw: dict[str, Any] = dict(
        mounts=["/r/runs/R", "/r/data/p"],
        workdir=None if c.own_program else "/r/runs/R/code",
        env_names=["JOB_DIR", "SECRET", "HOME=/tmp"],
        uid=1000,
        gid=1001,
        grace_s=25,
        gpus=["--gpus", "all"],
        labels={"gpu-train.run": "R"},
    )
    kw.update(over)
    return container.run_argv("docker", "gpu-train-R-0", IMAGE_ID, c, job, **kw)


@pytest.mark.parametrize(("engine", "mqueue", "shared"), [("docker", False, True), ("podman", True, True), ("podman", False, False)])
def test_host_ipc_where_the_engine_can_share_it(engine, mqueue, shared):
    assert container.host_ipc(engine, mqueue) is shared
    got = " ".join(argv(ContainerSpec(image="img"), ["python3"], shm_bytes=None if shared else 8 << 30))
    assert ("--ipc host" in got) is shared and ("--shm-size 8589934592b" in got) is not shared


@pytest.mark.parametrize(
    ("engine", "configured", "hybrid", "runc", "chosen"),
    [
        ("podman", "crun", True, True, "runc"),  # crun refuses hybrid cgroups: runc runs
        ("podman", "crun", False, True, None),  # cgroup v2 (or v1 alone): crun runs
        ("podman", "runc", True, True, None),
        ("docker", "crun", True, True, None),  # Docker's runtime is its daemon's
    ],
)
def test_oci_runtime(engine, configured, hybrid, runc, chosen):
    assert container.oci_runtime(engine, configured, hybrid, runc) == chosen
    assert (" --runtime runc " in " ".join(argv(ContainerSpec(image="i"), ["p"], runtime=chosen))) is (chosen is not None)


def test_crun_on_a_hybrid_host_without_runc_is_refused_with_the_fix():
    with pytest.raises(AgentError, match="install runc"):
        container.oci_runtime("podman", "crun", True, False)


def test_run_argv_code_in_the_image():
    """The project's command replaces the image's ENTRYPOINT and CMD; every flag the issue names is there."""
    got = argv(ContainerSpec(image="img"), ["python3", "-u", "train.py", "--lr", "1"])
    joined = " ".join(got)
    for part in (
        "--rm --name gpu-train-R-0 --init --stop-timeout 25",  # SIGTERM passed on, the run's grace
        "--network host --ipc host",  # NCCL across nodes, DataLoader's shared memory
        "--user 1000:1001",  # files in the mounts are the user's
        "--gpus all",
        "--volume /r/runs/R:/r/runs/R --volume /r/data/p:/r/data/p",  # at the same paths
        "--workdir /r/runs/R/code",
        "--env JOB_DIR --env SECRET --env HOME=/tmp",  # by name: values stay off the command line
    ):
        assert part in joined
    assert got[got.index("--entrypoint") :] == ["--entrypoint", "python3", IMAGE_ID, "-u", "train.py", "--lr", "1"]


@pytest.mark.parametrize(
    ("entrypoint", "args", "job", "tail"),
    [
        ((), (), [], [IMAGE_ID]),  # the image's ENTRYPOINT and CMD as they are
        ((), ("--epochs", "2"), ["--epochs", "2"], [IMAGE_ID, "--epochs", "2"]),  # args replace CMD
        (("python3", "-m", "trainer"), (), [], ["--entrypoint", "python3", IMAGE_ID, "-m", "trainer"]),  # command: CMD dropped
        (("python3", "-m", "trainer"), ("--x",), ["--x"], ["--entrypoint", "python3", IMAGE_ID, "-m", "trainer", "--x"]),
    ],
)
def test_run_argv_own_program_vertex_semantics(entrypoint, args, job, tail):
    c = ContainerSpec(image="img", own_program=True, entrypoint=entrypoint, args=args)
    got = argv(c, job)
    assert "--workdir" not in got  # the image's own WORKDIR
    assert got[-len(tail) :] == tail
    assert got.count(IMAGE_ID) == 1


def test_run_argv_podman_keeps_the_users_id():
    got = container.run_argv(
        "podman", "n", IMAGE_ID, ContainerSpec(image="i"), ["bash", "-c", "x"],
        mounts=[], workdir="/w", env_names=[], uid=1000, gid=1000, grace_s=0.4, gpus=[], labels={},
    )  # fmt: skip
    assert got[:2] == ["podman", "run"] and "--userns" in got and got[got.index("--stop-timeout") + 1] == "1"


@pytest.mark.parametrize(
    ("cmd", "given", "entry", "extra", "want"),
    [
        (["serve"], (), (), ["--resume"], ["serve", "--resume"]),  # resume args after the image's CMD, never instead
        (["serve"], ("--a",), (), ["--resume"], ["--a", "--resume"]),
        (["serve"], (), ("run",), ["--resume"], ["--resume"]),  # an entrypoint given drops the CMD (Docker, Vertex)
        (None, (), (), [], []),
    ],
)
def test_own_program_args(cmd, given, entry, extra, want):
    c = ContainerSpec(image="i", own_program=True, args=given, entrypoint=entry)
    assert container.own_program_args(c, cmd, extra) == want


@pytest.mark.parametrize(
    ("docker", "podman", "result"),
    [
        (container.OK, container.ABSENT, "docker"),
        (container.OK, container.OK, "docker"),
        (container.DENIED, container.OK, "podman"),  # rootless Podman where Docker refuses the user
        (container.ABSENT, container.OK, "podman"),
        (container.DENIED, container.ABSENT, "docker group, and membership of that group is root"),
        (container.DOWN, container.ABSENT, "its daemon does not answer"),
        (container.ABSENT, container.DOWN, "Podman is installed but does not run"),
        (container.ABSENT, container.ABSENT, "neither: sudo apt-get install docker.io"),
    ],
)
def test_choose_engine(docker, podman, result):
    if result in ("docker", "podman"):
        assert container.choose_engine(docker, podman, "ana", 1000) == result
    else:
        with pytest.raises(AgentError, match=result):
            container.choose_engine(docker, podman, "ana", 1000)


@pytest.mark.parametrize(
    ("code", "stderr", "word"),
    [
        (0, "", container.OK),
        (1, "permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock", container.DENIED),
        (1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?", container.DOWN),
    ],
)
def test_probe_said(code, stderr, word):
    assert container.probe_said(code, stderr) == word


@pytest.mark.parametrize(
    ("engine", "gpus", "cdi", "runtime", "want"),
    [
        ("docker", 0, False, False, []),
        ("docker", 2, True, True, ["--device", "nvidia.com/gpu=all"]),  # CDI first: survives daemon-reload
        ("docker", 2, False, True, ["--gpus", "all"]),
        ("podman", 1, True, False, ["--device", "nvidia.com/gpu=all"]),
        ("docker", 1, False, False, "nvidia-ctk runtime configure"),
        ("podman", 1, False, False, "nvidia-ctk cdi generate"),
    ],
)
def test_gpu_flags(engine, gpus, cdi, runtime, want):
    if isinstance(want, list):
        assert container.gpu_flags(engine, gpus, cdi, runtime) == want
    else:
        with pytest.raises(AgentError, match=want):
            container.gpu_flags(engine, gpus, cdi, runtime)


@pytest.mark.parametrize(
    ("named", "digests", "want"),
    [
        ("127.0.0.1:5000/gt/job:1", ["127.0.0.1:5000/gt/job@sha256:aa"], "127.0.0.1:5000/gt/job@sha256:aa"),
        ("pytorch/pytorch:2.3", ["other/x@sha256:bb", "docker.io/pytorch/pytorch@sha256:cc"], "docker.io/pytorch/pytorch@sha256:cc"),
        ("ubuntu", ["docker.io/library/ubuntu@sha256:dd"], "docker.io/library/ubuntu@sha256:dd"),
        ("local/built:1", [], None),  # imported or built here: no registry digest
    ],
)
def test_pinned(named, digests, want):
    assert container.pinned({"Id": IMAGE_ID, "RepoDigests": digests}, named) == (IMAGE_ID, want)


def test_pinned_without_id():
    with pytest.raises(AgentError, match="without an ID"):
        container.pinned({}, "x")


@pytest.mark.parametrize(
    ("free", "layers", "problem"),
    [
        (10 << 30, 3 << 30, None),
        (8 << 30, 3 << 30, "8.0 GiB free, and its layers are 3.0 GiB compressed: the pull needs about 9.0 GiB"),
        (5 << 30, None, None),
        (3 << 30, None, "its size is unknown: the pull needs about 4.0 GiB"),
    ],
)
def test_space_problem(free, layers, problem):
    got = container.space_problem(free, layers, 4 << 30)
    assert got == problem if problem is None else problem in (got or "")


def test_pull_progress_counts_layers():
    done: set[str] = set()
    layers: set[str] = set()
    said = [
        container.pull_progress(line, done, layers)
        for line in (
            "1: Pulling from gt/job",
            "aaaaaaaaaaaa: Pulling fs layer",
            "bbbbbbbbbbbb: Already exists",
            "aaaaaaaaaaaa: Pull complete",
        )
    ]
    assert said == [None, "0/1 layers", "1/2 layers", "2/2 layers"]


def test_pull_progress_of_podman_without_a_terminal():
    """Podman 4.3.1's lines as a pull from the test registry printed them (stdout not a terminal)."""
    done: set[str] = set()
    layers: set[str] = set()
    lines = (
        "Trying to pull 127.0.40.31:41689/gt/pulled:1...",
        "Getting image source signatures",
        "Copying blob sha256:574c695e20f7c35bbfbdaf03ecd2a55797c395dfd3fd1b62012c841adfb72fbd",
        "Copying blob sha256:57a7a85689618770ddfb2459645330bf456405eeb7003a56e650c5560915405e",
        "Copying config sha256:9b3ce22df5cc9250269809da4af6eb81197a19f5e49fe1ac07bc779a4563aa1f",
        "Writing manifest to image destination",
    )
    said = [container.pull_progress(line, done, layers) for line in lines]
    assert said == [None, None, "0/1 layers", "0/2 layers", "2/2 layers", None]


def test_container_name_is_per_root_and_valid():
    a, b = container.container_name("/home/a/.gpu-train", "job_1"), container.container_name("/home/b/.gpu-train", "job_1")
    assert a != b and a.startswith("gpu-train-job_1-")


@pytest.mark.parametrize(
    ("image", "entrypoint", "script", "command", "args", "want"),
    [
        (None, "", "t.py", None, "", None),
        ("none", "", "t.py", None, "", None),  # --image none: on the host, whatever the stack says
        ("nvcr.io/nvidia/pytorch:24.05-py3", "", "t.py", None, "", ContainerSpec(image="nvcr.io/nvidia/pytorch:24.05-py3")),
        ("img:1", "python3 -m t", None, None, "--a 'b c'", ContainerSpec("img:1", True, ("python3", "-m", "t"), ("--a", "b c"))),
        ("img:1", "", None, None, "", ContainerSpec("img:1", own_program=True)),
        ("Img:1", "", "t.py", None, "", "not an image reference"),
        ("--privileged", "", "t.py", None, "", "not an image reference"),
        ("img", "x", "t.py", None, "", "--entrypoint goes with the image's own program"),
        (None, "x", "t.py", None, "", "give --image IMAGE too"),
    ],
)
def test_container_spec(image, entrypoint, script, command, args, want):
    if isinstance(want, str):
        with pytest.raises(jobs.JobError, match=want):
            jobs.container_spec(image, entrypoint, script, command, args, False)
    else:
        assert jobs.container_spec(image, entrypoint, script, command, args, False) == want


def test_job_spec_own_program_needs_no_script(tmp_path):
    spec = jobs.job_spec(
        run="r_1", base="r", script=None, command=None, args="--x 1", env=["A=1"], python=None, expect_gpus=0,
        code_dir=tmp_path, image="img:1", entrypoint="", resume_args="--resume",
    )  # fmt: skip
    assert spec.container == ContainerSpec("img:1", own_program=True, args=("--x", "1"))
    assert spec.env == {"A": "1"} and spec.resume_args == ("--resume",) and spec.script is None


def test_contract_carries_the_container_and_the_digest():
    spec = JobSpec(run_id="r", base="r", container=ContainerSpec("img", True, ("a",), ("b",)))
    assert JobSpec.from_json(spec.to_json()) == spec
    assert JobSpec.from_json({**spec.to_json(), "container": None}).container is None
    with pytest.raises(ValueError, match="the job spec's container has no image"):
        JobSpec.from_json({**spec.to_json(), "container": {"args": []}})
    with pytest.raises(ValueError, match="container's entrypoint is"):
        JobSpec.from_json({**spec.to_json(), "container": {"image": "i", "entrypoint": "sh"}})
    record = RunRecord.from_json({"id": "r", "imageId": IMAGE_ID, "imageDigest": "h/r@sha256:1"})
    assert (record.image_id, record.image_digest) == (IMAGE_ID, "h/r@sha256:1")


def test_unit_removes_the_container_after_its_stop():
    """The unit's stop ends the `docker run` client; ExecStopPost removes the container by name, and the
    unit stops before the engine's at shutdown (After=docker.service)."""
    post = [["/usr/bin/docker", "stop", "--time", "25", "gpu-train-r-1"], ["/usr/bin/docker", "rm", "--force", "gpu-train-r-1"]]
    got = units.systemd_run_argv("r", "ana", 25, ["w"], {}, stop_post=post)
    stops = [a for a in got if "ExecStopPost" in a]  # `stop` first: it waits for the job (ExecStopPost runs once screen is gone)
    assert stops == [
        "--property=ExecStopPost=-/usr/bin/docker stop --time 25 gpu-train-r-1",
        "--property=ExecStopPost=-/usr/bin/docker rm --force gpu-train-r-1",
    ]
    assert "--property=After=docker.service" in got
    assert not any("ExecStopPost" in a for a in units.systemd_run_argv("r", "ana", 25, ["w"], {}))


@pytest.mark.parametrize(
    ("ref", "where", "google"),
    [
        ("us-central1-docker.pkg.dev/p/repo/img:1", "us-central1-docker.pkg.dev", True),
        ("gcr.io/p/img", "gcr.io", True),
        ("127.0.0.1:5000/img", "127.0.0.1:5000", False),
        ("localhost/img", "localhost", False),
        ("pytorch/pytorch", "docker.io", False),
        ("ubuntu", "docker.io", False),
    ],
)
def test_registry_host(ref, where, google):
    assert registry.registry_host(ref) == where
    assert registry.google_registry(where) is google


def test_login_keeps_the_token_off_argv_and_out_of_the_users_config():
    argv, env = registry.login_argv("docker", "h:5000", "u", "/tmp/x")
    assert "--password-stdin" in argv and env == {"DOCKER_CONFIG": "/tmp/x"}
    argv, env = registry.login_argv("podman", "h:5000", "u", "/tmp/x")
    assert "--password-stdin" in argv and env == {"REGISTRY_AUTH_FILE": "/tmp/x/auth.json"}


def test_registry_credentials_are_kept_0600_outside_the_run_and_go_when_it_ends(tmp_path):
    from agent import prune, store

    root = str(tmp_path)
    run_dir = os.path.join(root, "runs", "job_1")
    os.makedirs(run_dir)
    env, secrets = registry.split({"A": "1", registry.TOKEN_ENV: "tok", registry.USER_ENV: "me"})
    assert env == {"A": "1"} and secrets == {registry.TOKEN_ENV: "tok", registry.USER_ENV: "me"}
    registry.keep(root, "job_1", secrets)
    path = store.secrets_path(root, "job_1")
    assert not path.startswith(run_dir + os.sep)  # the run's folder is its container's mount
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert registry.kept(root, "job_1") == secrets
    os.chmod(path, 0o644)
    assert registry.kept(root, "job_1") == {}  # a file others may read is not trusted
    os.chmod(path, 0o600)
    for state, kept in (("running", True), ("interrupted", True), ("failed", False)):
        store.update_state(run_dir, state=state)
        assert os.path.exists(path) is kept, state
    registry.keep(root, "job_1", secrets)
    prune.prune_run(run_dir)  # (its end removed them already: prune keeps the promise whatever ended it)
    assert not os.path.exists(path)
    registry.keep(root, "job_1", secrets)
    registry.keep(root, "job_1", {})  # none: no file
    assert not os.path.exists(path) and registry.kept(root, "job_1") == {}
