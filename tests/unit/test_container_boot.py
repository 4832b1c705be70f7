"""gpu-train:image on a VM: the startup script's containers block (gpu_train/data/containers.sh.in), run
by bash against stand-in commands that record what they were asked: Docker's data root on the data disk
and cgroupfs, the toolkit's absence said, the user in the docker group, the stack's image pulled in a
unit of its own with the VM's token on stdin into a folder removed after the pull."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.gcp import vm
from gpu_train.stack import config
from tests.conftest import gcp_raw

CATALOG = load_catalog()
IMAGE = "us-central1-docker.pkg.dev/proj-1/train/job:1"
TOKEN = "ya29.vm-token-for-tests"

STUB = """#!/bin/bash
printf '%s\\n' "$(basename "$0") $*" >> "$GT_CALLS"
case "$(basename "$0")" in
  docker) if [ "$1" = login ]; then printf 'stdin=%s\\n' "$(cat)" >> "$GT_CALLS"; ls -ld "$DOCKER_CONFIG" | cut -c1-10 >> "$GT_CALLS"; fi
          [ "$1" = pull ] && echo "config=$DOCKER_CONFIG" >> "$GT_CALLS"; exit 0 ;;
  apt-get) exit 100 ;;  # nothing installable (the toolkit's apt repository is not configured)
  curl) printf '{"access_token": "%s", "expires_in": 3599}' "$GT_TOKEN" ;;
  mountpoint|systemctl|usermod|systemd-run|nvidia-smi|getent) exit 0 ;;
esac
"""


def block(image: str | None) -> str:
    script = vm.startup_script(config.parse(gcp_raw(image=image), "s", CATALOG), b"agent", vm.read_startup_template())
    start, end = script.index("# --- gpu-train: containers"), script.index("# --- end of containers")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    return script[start:end]


@pytest.fixture
def stubs(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "apt-get", "curl", "mountpoint", "systemctl", "usermod", "systemd-run", "nvidia-smi", "getent"):
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "GT_CALLS": str(tmp_path / "calls"),
        "GT_ETC": str(tmp_path / "etc"),
        "GT_LIB": str(tmp_path / "lib"),
        "GT_DATA_MNT": str(tmp_path / "mnt"),
        "GT_TOKEN": TOKEN,
        "TMPDIR": str(tmp_path / "tmp"),
    }


def test_a_stack_without_an_image_does_nothing_of_it(tmp_path: Path, stubs: dict[str, str]) -> None:
    said = subprocess.run(["bash", "-c", block(None)], env=stubs, capture_output=True, text=True)
    assert said.returncode == 0 and not Path(stubs["GT_CALLS"]).exists()


def test_docker_is_made_ready_and_the_image_pulled_with_the_vms_token(tmp_path: Path, stubs: dict[str, str]) -> None:
    (tmp_path / "tmp").mkdir()
    said = subprocess.run(["bash", "-c", block(IMAGE)], env=stubs, capture_output=True, text=True)
    assert said.returncode == 0, said.stderr
    assert "NVIDIA Container Toolkit is not on this image" in said.stderr  # said, not assumed
    conf = json.loads((tmp_path / "etc" / "docker" / "daemon.json").read_text())
    assert conf == {"data-root": f"{tmp_path}/mnt/docker", "exec-opts": ["native.cgroupdriver=cgroupfs"]}
    calls = Path(stubs["GT_CALLS"]).read_text().splitlines()
    assert "usermod -aG docker trainer" in calls and "systemctl restart docker" in calls
    run = next(c for c in calls if c.startswith("systemd-run"))
    assert run.endswith(f"{tmp_path}/lib/pull-images {IMAGE}") and "--unit=gpu-train-pull" in run
    # The pull unit's script, as systemd-run would run it:
    Path(stubs["GT_CALLS"]).write_text("")
    pulled = subprocess.run([f"{tmp_path}/lib/pull-images", IMAGE], env=stubs, capture_output=True, text=True)
    assert pulled.returncode == 0, pulled.stderr
    calls = Path(stubs["GT_CALLS"]).read_text().splitlines()
    login = next(c for c in calls if c.startswith("docker login"))
    assert TOKEN not in login and "--password-stdin us-central1-docker.pkg.dev" in login  # never on argv
    assert f"stdin={TOKEN}" in calls and "drwx------" in calls  # on stdin, into a folder of its own
    folder = next(c for c in calls if c.startswith("config=")).removeprefix("config=")
    assert not os.path.exists(folder)  # removed after the pull
    assert f"docker pull {IMAGE}" in calls


def test_a_bad_image_in_the_stack_is_a_problem() -> None:
    with pytest.raises(config.ConfigError, match="image"):
        config.parse(gcp_raw(image="--privileged"), "s", CATALOG)


def test_the_vm_reads_the_images_repository_only() -> None:
    """roles/artifactregistry.reader on the image's repository for the VM's account, nothing project-wide;
    the read-only storage scope its token needs; an image elsewhere gets no grant (its token is a secret)."""
    from infra import program
    from infra.ops import preview

    result = preview.run(program.main, stack="s", config=gcp_raw(image=IMAGE))
    assert result.error is None, result.error
    (sa,) = [a for a in result.of_type("serviceaccount/account:Account") if a.name == "gpu-sa"]
    email = f"serviceAccount:{sa.inputs['accountId']}@proj-1.iam.gserviceaccount.com"
    (grant,) = result.of_type("artifactregistry/repositoryIamMember:RepositoryIamMember")
    assert {k: grant.inputs[k] for k in ("project", "location", "repository", "role", "member")} == {
        "project": "proj-1",
        "location": "us-central1",
        "repository": "train",
        "role": "roles/artifactregistry.reader",
        "member": email,
    }
    assert not any("artifactregistry" in m.inputs["role"] for m in result.of_type("projects/iAMMember:IAMMember"))
    (inst,) = result.of_type("compute/instance:Instance")
    assert "https://www.googleapis.com/auth/devstorage.read_only" in inst.inputs["serviceAccount"]["scopes"]
    other = preview.run(program.main, stack="s", config=gcp_raw(image="nvcr.io/nvidia/pytorch:24.05-py3"))
    assert other.error is None and not other.of_type("artifactregistry/repositoryIamMember:RepositoryIamMember")
