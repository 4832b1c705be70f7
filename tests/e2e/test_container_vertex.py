"""Vertex AI's ways, in containers on a real Docker daemon (tests/containers.py), real sshds and the real
`gpu-train`: an imported CustomJob's containerSpec run as it ran there, each node of a cluster told its place
(CLUSTER_SPEC), and a job whose pools have images, commands, args and env of their own (`train --pools`).
Split from test_container.py (the run in an image itself)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tests import containers
from tests.conftest import Lab
from tests.e2e.test_container import LAB_ADDRESS, PROG, SECRET, scan_cmdlines, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("containers")]  # one daemon per module, on one worker
ENTRY = ('ENTRYPOINT ["/usr/local/bin/prog"]', 'CMD ["--default", "x"]')


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory: pytest.TempPathFactory):
    if reason := containers.skip_reason():
        pytest.skip(reason)
    d = containers.Dockerd(tmp_path_factory.mktemp("dockerd")).start()
    d.import_rootfs("gt/base:1", ("USER 4321",))
    d.derive("gt/base:1", "gt/prog:1", {"/usr/local/bin/prog": PROG, "/usr/local/bin/prog2": PROG, "/etc/gt-marker": "P"}, ENTRY)
    d.derive("gt/prog:1", "gt/worker:1", {"/etc/gt-marker": "W"}, ENTRY)  # a worker pool's own image
    yield d
    d.stop()


@pytest.fixture
def clab(tmp_path: Path, dockerd: containers.Dockerd):
    lab = Lab(tmp_path, LAB_ADDRESS, setenv=f"DOCKER_HOST={dockerd.host} PATH={Path(containers.DOCKER).parent}:/usr/sbin:/usr/bin:/bin")
    yield lab
    lab.sshd.stop()


VERTEX_JOB = """\
displayName: containerized
jobSpec:
  workerPoolSpecs:
  - machineSpec: {machineType: g2-standard-8, acceleratorType: NVIDIA_L4, acceleratorCount: 1}
    replicaCount: 1
    containerSpec:
      imageUri: gt/prog:1
      command: [/usr/local/bin/prog2, a]
      args: [--lr, "0.1"]
      env: [{name: GREETING, value: hello vertex}]
  baseOutputDirectory: {outputUriPrefix: gs://bucket/out}
"""


def test_an_imported_vertex_container_job_runs_as_it_did_there(clab: Lab, dockerd: containers.Dockerd) -> None:
    """`import` of a CustomJob with a containerSpec, then the train command it prints, unchanged but for the
    stack: the image's own program with its command, args and env (from the 0600 file the import wrote)."""
    (clab.tmp / "job.yaml").write_text(VERTEX_JOB)
    said = clab.fab("import", str(clab.tmp / "job.yaml"), "--stack", "vx", "--stacks-dir", str(clab.tmp / "imported"), "--json")
    assert said.returncode == 0, said.stderr
    train = json.loads(said.stdout)["train"]
    env_file = Path(train[train.index("--env-file") + 1])
    assert env_file.stat().st_mode & 0o777 == 0o600 and "hello vertex" not in " ".join(train)
    assert train[:4] == ["gpu-train", "train", "--stack", "vx"]
    run = clab.train(*train[4:])  # (on the lab's stack)
    assert clab.wait(run)["state"] == "succeeded", clab.log(run)
    job = clab.remote / "runs" / run / "job"
    assert (job / "argv.txt").read_text().split("\n")[:-1] == ["/usr/local/bin/prog2", "a", "--lr", "0.1"]
    greeting, model_dir, _ = (job / "env.txt").read_text().split("\n", 2)
    assert (greeting, model_dir) == ("hello vertex", f"{job}/model/")


def test_a_two_node_cluster_runs_the_image_on_both_with_its_place(tmp_path: Path, dockerd: containers.Dockerd) -> None:
    """Each node's container gets its part (NODE_RANK, TF_CONFIG, CLUSTER_SPEC) and its own name on the
    one daemon the two loopback hosts share; the run succeeds on both."""
    from remote.loopback import Sshd
    from tests.conftest import cluster_stack, fab_env, run_fab

    path = f"DOCKER_HOST={dockerd.host} PATH={Path(containers.DOCKER).parent}:/usr/sbin:/usr/bin:/bin"
    a = Sshd(tmp_path / "a", "127.0.40.4", setenv=path).start()
    b = Sshd(tmp_path / "b", "127.0.40.5", client_key=a.client_key, setenv=path).start()
    try:
        cluster_stack(tmp_path / "stacks", "duo", [a.spec, b.spec], a.client_key)
        (tmp_path / "work").mkdir()
        env = fab_env(tmp_path / "stacks", tmp_path / "home", "duo", tmp_path / "work")
        out = run_fab(env, tmp_path / "work", "train", "--image", "gt/prog:1", "--name", "duo", check=True, timeout=300).stdout
        run = out.split()[1]
        for node in (0, 1):
            state = tmp_path / f"node{node}" / "runs" / run / "state.json"
            wait_for(lambda state=state: state.exists() and json.loads(state.read_text())["state"] in ("succeeded", "failed"), 120)
            assert json.loads(state.read_text())["state"] == "succeeded", (tmp_path / f"node{node}" / "runs" / run / "log").read_text()
            _, _, spec = (tmp_path / f"node{node}" / "runs" / run / "job" / "env.txt").read_text().split("\n", 2)
            task = json.loads(spec)["task"]
            assert task == {"type": f"workerpool{node}", "index": 0}
    finally:
        a.stop()
        b.stop()


TWO_POOLS = """\
workerPoolSpecs:
- machineSpec: {machineType: g2-standard-8, acceleratorType: NVIDIA_L4, acceleratorCount: 1}
  containerSpec:
    imageUri: gt/prog:1
    command: [/usr/local/bin/prog2, chief]
    args: [--lr, "0.1"]
    env: [{name: GREETING, value: hello chief}]
- machineSpec: {machineType: n1-standard-8}
  replicaCount: 1
  containerSpec:
    imageUri: gt/worker:1
    args: [--shard, "1"]
    env: [{name: GREETING, value: %s}]
"""


def test_an_imported_vertex_job_runs_each_pools_own_image_on_its_nodes(tmp_path: Path, dockerd: containers.Dockerd) -> None:
    """A CustomJob whose two pools have different images, commands, args and env: `import`, then its train
    command on two loopback nodes of one daemon. Node 0 runs the chief pool's container, node 1 the worker
    pool's (its image's ID recorded, its file, its args after the image's ENTRYPOINT, its env), each env
    value from a 0600 file and never on a command line."""
    from remote.loopback import Sshd
    from tests.conftest import cluster_stack, fab_env, run_fab

    path = f"DOCKER_HOST={dockerd.host} PATH={Path(containers.DOCKER).parent}:/usr/sbin:/usr/bin:/bin"
    a = Sshd(tmp_path / "a", "127.0.40.20", setenv=path).start()
    b = Sshd(tmp_path / "b", "127.0.40.21", client_key=a.client_key, setenv=path).start()
    stop, hits = threading.Event(), []
    try:
        cluster_stack(tmp_path / "stacks", "duo", [a.spec, b.spec], a.client_key)
        (tmp_path / "work").mkdir()
        (tmp_path / "job.yaml").write_text(TWO_POOLS % SECRET)
        env = fab_env(tmp_path / "stacks", tmp_path / "home", "duo", tmp_path / "work")
        job = str(tmp_path / "job.yaml")
        said = run_fab(env, tmp_path / "work", "import", job, "--stack", "vx", "--stacks-dir", str(tmp_path / "imp"), "--json")
        assert said.returncode == 0, said.stderr
        train = json.loads(said.stdout)["train"]
        pools = Path(train[train.index("--pools") + 1])
        assert pools.stat().st_mode & 0o777 == 0o600 and SECRET in pools.read_text() and SECRET not in " ".join(train)
        threading.Thread(target=scan_cmdlines, args=(SECRET, stop, hits), daemon=True).start()
        out = run_fab(env, tmp_path / "work", "train", *train[4:], check=True, timeout=300).stdout  # (on the duo stack)
        run = out.split()[1]
        for node, image, marker, argv, greeting in (
            (0, "gt/prog:1", "P", ["/usr/local/bin/prog2", "chief", "--lr", "0.1"], "hello chief"),
            (1, "gt/worker:1", "W", ["/usr/local/bin/prog", "--shard", "1"], SECRET),
        ):
            run_dir = tmp_path / f"node{node}" / "runs" / run
            record = run_dir / "state.json"
            wait_for(lambda r=record: r.exists() and json.loads(r.read_text())["state"] in ("succeeded", "failed"), 120)
            st = json.loads(record.read_text())
            assert st["state"] == "succeeded", (run_dir / "log").read_text()
            assert st["imageId"] == dockerd.out("image", "inspect", "--format", "{{.Id}}", image)  # its pool's very image
            assert (run_dir / "job" / "marker.txt").read_text().strip() == marker
            assert (run_dir / "job" / "argv.txt").read_text().split("\n")[:-1] == argv
            got, _, spec = (run_dir / "job" / "env.txt").read_text().split("\n", 2)
            assert got == greeting and json.loads(spec)["task"] == {"type": f"workerpool{node}", "index": 0}
            assert SECRET not in (run_dir / "log").read_text()
            (run_dir / "job" / "marker.txt").unlink()

        # `resume`: each node relaunches its own pool's job, in the image its first start pinned
        run_fab(env, tmp_path / "work", "resume", "--run", run, check=True, timeout=300)
        for node, image, marker in ((0, "gt/prog:1", "P"), (1, "gt/worker:1", "W")):
            run_dir = tmp_path / f"node{node}" / "runs" / run
            done = run_dir / "job" / "marker.txt"
            wait_for(lambda d=done: d.exists() and d.read_text().strip(), 120)
            assert done.read_text().strip() == marker
            st = json.loads((run_dir / "state.json").read_text())
            assert st["resumes"] == 1 and st["imageId"] == dockerd.out("image", "inspect", "--format", "{{.Id}}", image)
    finally:
        stop.set()
        a.stop()
        b.stop()
    assert hits == [], f"an env value on a command line: {hits}"
