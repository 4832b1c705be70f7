"""`train --image` on rootless Podman, for real: a user of this machine who is neither root nor in the
docker group (a real dockerd runs and refuses them its socket) logs in over a real sshd, and the real
`gpu-train train --image` runs the job in a container of their own Podman (no daemon, their uid
mapped to theirs outside); `stop` gives its SIGTERM handler the grace and removes the container.

Debian's Podman 4.3.1, its images in the user's own store (a `podman import` of the guest tier's Debian
root file system). Its runtime crun (Debian's default) refuses this host's hybrid cgroups ("crun: cgroups
in hybrid mode not supported"): gpu-train runs the container with runc there (agent/container.py
oci_runtime). This machine is itself a container without /dev/mqueue: Podman cannot share
the host's IPC there, so the run gets a /dev/shm of its own as big as the host's (agent/container.py
host_ipc). Loopback addresses 127.0.40.10-19."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests import containers
from tests.conftest import fab_env, run_fab
from tests.e2e.test_container import TRAIN, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("podman")]
PODMAN = shutil.which("podman") or "/usr/bin/podman"
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"


def skip_reason() -> str | None:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        return "needs root and useradd (a user of its own for rootless Podman)"
    if not os.path.exists(PODMAN) or not shutil.which("newuidmap"):
        return "needs podman and uidmap: apt-get install podman uidmap catatonit (scripts/test does, as root)"
    return containers.skip_reason()


class User:
    """A login of its own (subordinate uids for rootless Podman); removed with everything it left running."""

    def __init__(self, name: str):
        self.name = name
        subprocess.run(["userdel", "-r", name], capture_output=True, check=False)
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
        subprocess.run(["usermod", "-p", "*", name], check=True)  # (a locked account refuses key logins without PAM)
        self.pw = pwd.getpwnam(name)

    def run(
        self, *argv: str, input: bytes | None = None, stdin=None, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        env = {"HOME": self.pw.pw_dir, "PATH": "/usr/bin:/bin", "USER": self.name}
        said = subprocess.run(
            [RUNUSER, "-u", self.name, "--", *argv], env=env, input=input, stdin=stdin, capture_output=True, timeout=timeout, cwd="/"
        )
        if check and said.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {said.stderr.decode(errors='replace')[-2000:]}")
        return said

    def podman(self, *args: str, **kw) -> str:
        return self.run(PODMAN, *args, **kw).stdout.decode().strip()

    def remove(self) -> None:
        for pid in [p for p in os.listdir("/proc") if p.isdigit()]:  # its Podman's pause process, conmon: by id
            try:
                if os.stat(f"/proc/{pid}").st_uid == self.pw.pw_uid:
                    os.kill(int(pid), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
        time.sleep(0.2)
        subprocess.run(["userdel", "-r", self.name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def podman_user(tmp_path_factory: pytest.TempPathFactory):
    if reason := skip_reason():
        pytest.skip(reason)
    user = User(f"gtpod{os.getpid() % 100000}")
    dockerd = containers.Dockerd(tmp_path_factory.mktemp("dockerd")).start()  # root's: its socket refuses the user
    extra = tmp_path_factory.mktemp("marker")
    try:
        (extra / "etc").mkdir()
        (extra / "etc" / "gt-marker").write_text("A\n")
        excluded = [f"--exclude={p}" for p in containers.SLIM]
        tar = subprocess.Popen(
            ["tar", "-c", *excluded, "-C", str(containers.ROOTFS), ".", "-C", str(extra), "./etc/gt-marker"], stdout=subprocess.PIPE
        )
        user.run(PODMAN, "import", "--change", "USER 4321", "-", "gt/job:1", stdin=tar.stdout)
        tar.wait()
        yield user, dockerd
    finally:
        dockerd.stop()
        user.remove()


@contextlib.contextmanager
def podman_host(user: User, dockerd: containers.Dockerd, address: str):
    """The user's login over a real sshd (Docker's socket refused to them), an SSH stack on it and a
    project folder with TRAIN: (the laptop's environment, the project, REMOTE_ROOT)."""
    from remote.loopback import Sshd

    base = Path(tempfile.mkdtemp(prefix="gtpod-sshd-"))
    base.chmod(0o755)  # sshd reads authorized_keys as the user
    sshd = Sshd(base / "sshd", address, own_home=False, setenv=f"DOCKER_HOST={dockerd.host} PATH=/usr/bin:/bin")
    sshd.user = user.name
    laptop = Path(tempfile.mkdtemp(prefix="gtpod-laptop-"))
    try:
        sshd.start()
        remote = Path(user.pw.pw_dir) / "gt-remote"
        sshd.stack_file(laptop / "stacks", "pod", remote, "/usr/bin/python3")
        code = laptop / "code"
        code.mkdir()
        (code / "train.py").write_text(TRAIN)
        yield fab_env(laptop / "stacks", laptop / "home", "pod", code), code, remote
    finally:
        sshd.stop()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(laptop, ignore_errors=True)


def test_rootless_podman_runs_and_stops_a_run_for_a_user_docker_refuses(podman_user) -> None:
    user, dockerd = podman_user
    with podman_host(user, dockerd, "127.0.40.10") as (env, code, remote):
        said = user.run("docker", "-H", dockerd.host, "version", check=False)
        assert b"permission denied" in said.stderr.lower(), said.stderr  # Docker is there, and refuses this user

        out = run_fab(env, code, "train", "--image", "gt/job:1", "--script", "train.py", "--env", "STEPS=6000", check=True, timeout=300)
        run = out.stdout.split()[1]
        run_dir = remote / "runs" / run
        seen = json.loads(
            wait_for(lambda: (run_dir / "job" / "seen-0.json").exists() and (run_dir / "job" / "seen-0.json").read_text(), 180)
        )
        state = json.loads((run_dir / "state.json").read_text())
        assert state["engine"] == "podman" and state["imageId"].removeprefix("sha256:") == user.podman(
            "image", "inspect", "--format", "{{.Id}}", "gt/job:1"
        )
        assert seen["marker"] == "A" and seen["uid"] == user.pw.pw_uid  # the image's file; the user's own uid inside
        assert (run_dir / "job" / "seen-0.json").stat().st_uid == user.pw.pw_uid  # what it writes is the user's outside
        assert seen["shmBytes"] > 64 << 20  # a /dev/shm of the host's size, not 64 MB
        if user.podman("info", "--format", "{{.Host.OCIRuntime.Name}}") == "crun" and os.path.ismount("/sys/fs/cgroup/unified"):
            assert " --runtime runc " in (run_dir / "log").read_text()  # (crun would refuse)
        names = user.podman("ps", "--format", "{{.Names}}").split()
        assert any(run in n for n in names), names

        said = run_fab(env, code, "stop", "--run", run, "--grace", "10", check=True, timeout=120).stdout
        saved = run_dir / "job" / "saved"
        assert saved.exists() and saved.read_text() in ("SIGINT", "SIGTERM"), (run_dir / "log").read_text()  # its 3 s handler ran
        assert f"{run}: stopped (SIGINT)" in said, said  # ended within the first grace: nothing more was needed
        assert json.loads((run_dir / "state.json").read_text())["state"] == "stopped"
        assert not [n for n in user.podman("ps", "-a", "--format", "{{.Names}}").split() if run in n]  # removed

        # The client killed (an OOM killer, by hand): the container runs on, the wrapper attaches to it again,
        # and `stop` still reaches the job's handler and removes the container.
        out = run_fab(
            env, code, "train", "--image", "gt/job:1", "--script", "train.py", "--env", "STEPS=6000", "--name", "again", check=True
        )
        run = out.stdout.split()[1]
        run_dir = remote / "runs" / run
        wait_for(lambda: (run_dir / "job" / "seen-0.json").exists(), 180)
        client = json.loads((run_dir / "state.json").read_text())["pid"]
        os.kill(client, signal.SIGKILL)
        wait_for(lambda: "attached to it again" in (run_dir / "log").read_text(), 60)
        assert any(run in n for n in user.podman("ps", "--format", "{{.Names}}").split())
        said = run_fab(env, code, "stop", "--run", run, "--grace", "10", check=True, timeout=120).stdout
        saved = run_dir / "job" / "saved"
        assert saved.exists() and f"{run}: stopped (SIGINT)" in said, (said, (run_dir / "log").read_text())
        assert json.loads((run_dir / "state.json").read_text())["state"] == "stopped"
        assert not [n for n in user.podman("ps", "-a", "--format", "{{.Names}}").split() if run in n]


def test_rootless_podman_pulls_from_a_registry_with_a_token_and_pins_the_digest(podman_user) -> None:
    """Podman's login (the token on stdin, into an auth file of the pull's own, removed after), its pull's
    lines as layers in the log, the registry digest pinned; the token in no log and not the job's. The
    registry is plain HTTP on loopback: the user's registries.conf says so, as it would for such a registry."""
    if not os.path.exists(containers.REGISTRY):
        pytest.skip("docker-registry is missing: apt-get install docker-registry")
    user, dockerd = podman_user
    dockerd.import_rootfs("gt/base:1")
    dockerd.derive("gt/base:1", "gt/pushme:1", {"/etc/gt-marker": "R"})
    registry = containers.Registry(Path(tempfile.mkdtemp(prefix="gtpod-registry-")), "127.0.40.11").start()
    try:
        digest = registry.push(dockerd, "gt/pushme:1", "gt/pulled:1")
        conf = Path(user.pw.pw_dir) / ".config" / "containers"
        user.run("mkdir", "-p", str(conf))
        user.run("sh", "-c", f"printf '[[registry]]\\nlocation = \"{registry.host}\"\\ninsecure = true\\n' > {conf}/registries.conf")
        with podman_host(user, dockerd, "127.0.40.12") as (env, code, remote):
            secrets = code.parent / "registry.env"
            secrets.write_text(f"GPU_TRAIN_REGISTRY_USER={registry.user}\nGPU_TRAIN_REGISTRY_TOKEN={registry.password}\n")
            secrets.chmod(0o600)
            image = f"{registry.host}/gt/pulled:1"
            out = run_fab(env, code, "train", "--image", image, "--script", "train.py", "--env-file", str(secrets), check=True, timeout=300)
            run = out.stdout.split()[1]
            run_dir = remote / "runs" / run
            record = run_dir / "state.json"
            wait_for(lambda: json.loads(record.read_text()).get("state") in ("succeeded", "failed"), 240)
            log = (run_dir / "log").read_text()
            assert json.loads(record.read_text())["state"] == "succeeded", log
            assert f"logged in to {registry.host}" in log and "pull: Copying blob" in log and " layers)" in log, log
            assert registry.password not in log
            assert json.loads(record.read_text())["imageDigest"] == digest
            seen = json.loads((run_dir / "job" / "seen-0.json").read_text())
            assert seen["marker"] == "R" and seen["registryToken"] is None  # the pull's, never the job's
            kept = user.run(
                "sh", "-c", f"cat {user.pw.pw_dir}/.config/containers/auth.json /tmp/podman-run-*/containers/auth.json", check=False
            )
            assert registry.host.encode() not in kept.stdout  # logged in for that pull only
    finally:
        registry.stop()
        shutil.rmtree(registry.base, ignore_errors=True)
