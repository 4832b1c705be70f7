"""Pulls from a registry with a token (tests/containers.py's htpasswd registry, a real Docker daemon, a real
sshd and the real `gpu-train`): the token logged in on stdin and kept out of the job, its log, its mounts and
runs/RUN/spec.json; a reboot pulls the run's image by digest with it; a disk without room refuses the pull."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import containers
from tests.conftest import Lab
from tests.e2e.test_container import project, state, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("containers")]  # one daemon per module, on one worker
LAB_ADDRESS = "127.0.40.7"
REGISTRY_ADDRESS = "127.0.40.9"


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory: pytest.TempPathFactory):
    if reason := containers.skip_reason():
        pytest.skip(reason)
    d = containers.Dockerd(tmp_path_factory.mktemp("dockerd")).start()
    d.import_rootfs("gt/base:1", ("USER 4321",))
    d.derive("gt/base:1", "gt/job:1", {"/etc/gt-marker": "A"}, ("USER 4321",))
    yield d
    d.stop()


@pytest.fixture
def clab(tmp_path: Path, dockerd: containers.Dockerd):
    lab = Lab(tmp_path, LAB_ADDRESS, setenv=f"DOCKER_HOST={dockerd.host} PATH={Path(containers.DOCKER).parent}:/usr/sbin:/usr/bin:/bin")
    yield lab
    lab.sshd.stop()


def test_a_registry_with_a_token_kept_out_of_everything(clab: Lab, dockerd: containers.Dockerd) -> None:
    """The pull logs in with the token on stdin into a config of its own (removed after), shows its
    progress in the log, pins the registry digest; the job never sees the token; a wrong one fails."""
    if not os.path.exists(containers.REGISTRY):
        pytest.skip("docker-registry is missing: apt-get install docker-registry")
    registry = containers.Registry(clab.tmp / "registry", REGISTRY_ADDRESS).start()
    try:
        dockerd.derive("gt/job:1", "gt/pushme:1", {"/opt/weights.bin": "w" * 100_000}, ("USER 4321",))
        digest = registry.push(dockerd, "gt/pushme:1", "gt/pulled:1")
        dockerd.docker("image", "rm", f"{registry.host}/gt/pulled:1", "gt/pushme:1")  # its top layer is in the registry only
        env_file = clab.tmp / "registry.env"
        env_file.write_text(f"GPU_TRAIN_REGISTRY_USER={registry.user}\nGPU_TRAIN_REGISTRY_TOKEN={registry.password}\n")
        env_file.chmod(0o600)
        code = project(clab)
        image = f"{registry.host}/gt/pulled:1"
        run = clab.train("--dir", str(code), "--image", image, "--script", "train.py", "--env-file", str(env_file))
        assert clab.wait(run)["state"] == "succeeded", clab.log(run)
        log = clab.log(run)
        assert "pull: " in log and " layers)" in log and f"logged in to {registry.host}" in log
        assert registry.password not in log
        assert state(clab, run)["imageDigest"] == digest
        seen = json.loads((clab.remote / "runs" / run / "job" / "seen-0.json").read_text())
        assert seen["registryToken"] is None  # the pull's, never the job's
        config = Path(os.path.expanduser("~/.docker/config.json"))
        assert not config.exists() or registry.host not in config.read_text()

        env_file.write_text(f"GPU_TRAIN_REGISTRY_USER={registry.user}\nGPU_TRAIN_REGISTRY_TOKEN=wrong\n")
        dockerd.docker("image", "rm", image)
        run = clab.train("--dir", str(code), "--image", image, "--script", "train.py", "--env-file", str(env_file))
        ended = clab.wait(run)
        assert ended["state"] == "failed" and f"login to {registry.host} failed" in (ended["reason"] or ""), ended
    finally:
        registry.stop()


def test_the_registry_token_is_in_no_file_the_job_can_read_and_a_reboot_still_pulls(clab: Lab, dockerd: containers.Dockerd) -> None:
    """The token is taken out of the spec before runs/RUN/spec.json is written (the run's folder is
    mounted into its container) and kept 0600 in REMOTE_ROOT/secrets, where no container looks: while the
    job runs no file under its mounts holds it. After a shutdown and the image gone, `boot` pulls the run's
    image by digest with it; the run's end removes it."""
    if not os.path.exists(containers.REGISTRY):
        pytest.skip("docker-registry is missing: apt-get install docker-registry")
    registry = containers.Registry(clab.tmp / "registry", REGISTRY_ADDRESS).start()
    try:
        dockerd.derive("gt/job:1", "gt/pushme:2", {"/opt/weights.bin": "v" * 50_000}, ("USER 4321",))
        digest = registry.push(dockerd, "gt/pushme:2", "gt/private:1")
        image = f"{registry.host}/gt/private:1"
        dockerd.docker("image", "rm", image, "gt/pushme:2")
        env_file = clab.tmp / "registry.env"
        env_file.write_text(f"GPU_TRAIN_REGISTRY_USER={registry.user}\nGPU_TRAIN_REGISTRY_TOKEN={registry.password}\nSTEPS=100000\n")
        code = project(clab)
        run = clab.train("--dir", str(code), "--image", image, "--script", "train.py", "--env-file", str(env_file))
        run_dir = clab.remote / "runs" / run
        wait_for(lambda: (run_dir / "job" / "seen-0.json").exists(), timeout=120)
        secret = registry.password.encode()
        spec = json.loads((run_dir / "spec.json").read_text())
        assert spec["env"].get("STEPS") == "100000" and not any(k.startswith("GPU_TRAIN_REGISTRY_") for k in spec["env"])
        mounted = [run_dir, clab.remote / "data"]  # the container's mounts: the run's folder, DATA_DIR's
        held = [str(p) for top in mounted for p in top.rglob("*") if p.is_file() and secret in p.read_bytes()]
        assert held == []
        kept = clab.remote / "secrets" / f"{run}.json"
        assert kept.stat().st_mode & 0o777 == 0o600 and secret in kept.read_bytes()

        env = {**os.environ, "DOCKER_HOST": dockerd.host, "PATH": f"{Path(containers.DOCKER).parent}:/usr/sbin:/usr/bin:/bin"}

        def agent(*args: str) -> dict:
            out = subprocess.run(
                [sys.executable, str(clab.remote / "bin" / "gpu-train-agent"), "--root", str(clab.remote), *args],
                capture_output=True, text=True, timeout=180, env=env,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout.strip().splitlines()[-1])

        assert agent("shutdown")["runs"] == [{"runId": run, "state": "interrupted"}]
        wait_for(lambda: state(clab, run)["state"] == "interrupted" and not dockerd.out("ps", "-q"), timeout=60)
        assert kept.exists()  # an interrupted run comes back: its pulls need them
        dockerd.docker("container", "prune", "--force")
        dockerd.docker("image", "rm", "--force", state(clab, run)["imageId"])  # gone from the host: pulled by digest
        env_file.write_text("")
        assert agent("boot")["actions"][0]["action"] == "resumed"
        wait_for(lambda: (run_dir / "job" / "seen-1.json").exists(), timeout=120)
        log = clab.log(run)
        assert f"pulling it by its digest {digest}" in log and f"logged in to {registry.host}" in log
        assert registry.password.encode() not in (run_dir / "log").read_bytes()
        clab.fab("stop", "--run", run, check=True)
        assert state(clab, run)["state"] == "stopped" and not kept.exists()  # ended: removed
    finally:
        registry.stop()


def test_a_pull_the_disk_has_no_room_for_is_refused_before_it_starts(tmp_path: Path, dockerd: containers.Dockerd) -> None:
    """The registry's manifest (read with the pull's own credentials) says the layers' size; a daemon
    whose data root has less than three times that free refuses, saying so, and fetches nothing."""
    registry = containers.Registry(tmp_path / "registry", REGISTRY_ADDRESS).start()
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)], check=True)
    tiny = None
    try:
        registry.push(dockerd, "gt/job:1", "gt/big:1")
        tiny = containers.Dockerd(tmp_path / "tiny", data_root=small / "data").start()
        lab = Lab(tmp_path / "lab", "127.0.40.6", setenv=f"DOCKER_HOST={tiny.host} PATH={Path(containers.DOCKER).parent}:/usr/bin:/bin")
        try:
            secrets = tmp_path / "registry.env"
            secrets.write_text(f"GPU_TRAIN_REGISTRY_USER={registry.user}\nGPU_TRAIN_REGISTRY_TOKEN={registry.password}\n")
            run = lab.train("--image", f"{registry.host}/gt/big:1", "--env-file", str(secrets), "--name", "big")
            ended = lab.wait(run)
            assert ended["state"] == "failed", ended
            assert "not pulling" in ended["reason"] and "its layers are" in ended["reason"] and "compressed" in ended["reason"], ended
            assert tiny.out("images", "-q") == ""  # nothing was fetched
        finally:
            lab.sshd.stop()
    finally:
        if tiny:
            tiny.stop()
        registry.stop()
        subprocess.run(["umount", "-l", str(small)], check=False)
