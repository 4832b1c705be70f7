"""One lab box, many projects (issue 38): two projects and two clones of one project (one of them another
user's laptop, the same login on the host) share a real sshd; every default keeps to its own project's runs,
`stop` stops what runs, `resume` of a running run refuses. The projects are tests/real_projects/, unchanged.
This suite's loopback addresses are 127.0.38.x."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Lab, project_id, run_fab

LAB_ADDRESS = "127.0.38.1"
pytestmark = [pytest.mark.long, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
PROJECTS = Path(__file__).parents[1] / "real_projects"


def checkout(where: Path, name: str) -> Path:
    """A clone of the real project ``name`` in ``where/name``, a git repo of its own."""
    folder = where / name
    shutil.copytree(PROJECTS / name, folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=folder, check=True)
    return folder


def fab_in(lab: Lab, folder: Path, *args: str, home: Path | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """`gpu-train ARGS` run in the project ``folder`` (``home``: another laptop's state, as another user's)."""
    env = {**lab.env, "GPU_TRAIN_PROJECT": str(folder), **({"GPU_TRAIN_HOME": str(home)} if home else {})}
    return run_fab(env, folder, *args, check=check, timeout=180)


def started(result: subprocess.CompletedProcess) -> str:
    return result.stdout.split()[1]  # "started RUN_ID on ..."


def recorded(lab: Lab, run: str) -> dict:
    return json.loads((lab.remote / "runs" / run / "state.json").read_text())


def wait_state(lab: Lab, run: str, states: tuple[str, ...], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (state := recorded(lab, run)).get("state") in states:
            return state
        time.sleep(0.1)
    raise AssertionError(f"{run} never reached {states}; log:\n{lab.log(run)[-3000:]}")


NANO = "config/train_shakespeare_char.py --out_dir=out"


def test_two_projects_and_two_clones_keep_to_their_own_runs(lab: Lab) -> None:
    alice, bob = checkout(lab.tmp / "alice", "nanogpt"), checkout(lab.tmp / "bob", "nanogpt")
    lm = checkout(lab.tmp / "lm", "lightning_trainer")
    bob_home = lab.tmp / "bob-laptop"  # bob's own laptop state: the same login on the host, another user
    for clone, home in ((alice, None), (bob, bob_home)):
        subprocess.run([sys.executable, "data/shakespeare_char/prepare.py"], cwd=clone, check=True, capture_output=True)
        fab_in(lab, clone, "push", "data", home=home, check=True)
    long_run = started(
        fab_in(lab, alice, "train", "--script", "train.py", "--args", f"{NANO} --max_iters=100000 --iter_sleep=0.5", check=True)
    )
    lm_run = started(fab_in(lab, lm, "train", "--script", "train.py", "--args", "--max_steps 3 --every_n_steps 1", check=True))
    bob_run = started(fab_in(lab, bob, "train", "--script", "train.py", "--args", f"{NANO} --max_iters=3", home=bob_home, check=True))
    assert wait_state(lab, lm_run, ("succeeded", "failed"))["state"] == "succeeded", lab.log(lm_run)
    assert wait_state(lab, bob_run, ("succeeded", "failed"))["state"] == "succeeded", lab.log(bob_run)
    wait_state(lab, long_run, ("running",))

    ids = {"alice": project_id(lab.home, alice), "bob": project_id(bob_home, bob), "lm": project_id(lab.home, lm)}
    assert len(set(ids.values())) == 3 and ids["alice"].startswith("nanogpt-") and ids["bob"].startswith("nanogpt-")
    assert [recorded(lab, r)["project"] for r in (long_run, bob_run, lm_run)] == [ids["alice"], ids["bob"], ids["lm"]]
    for who in ("alice", "bob"):  # each clone's pushed data is its own, where its job read it
        assert (lab.remote / "data" / ids[who] / "data" / "shakespeare_char" / "train.bin").is_file()

    # From the Lightning project: its `stop` stops nothing of nanoGPT's and says which run does run (exit 2).
    stopped = fab_in(lab, lm, "stop")
    assert stopped.returncode == 2, stopped.stdout + stopped.stderr  # which run? (bad input: nothing was done)
    assert "no run of this project is running" in stopped.stderr and long_run in stopped.stderr
    assert recorded(lab, long_run)["state"] == "running"
    doc = json.loads(fab_in(lab, lm, "status", "--json", check=True).stdout)
    assert [r["id"] for r in doc["runs"]] == [lm_run] and doc["otherProjectsRuns"] == 2 and doc["project"] == ids["lm"]
    table = fab_in(lab, lm, "status", check=True).stdout
    assert "2 runs of other projects on this host" in table and long_run not in table
    every = fab_in(lab, lm, "status", "--all-projects", check=True).stdout.splitlines()
    assert "PROJECT" in next(line for line in every if "RUN" in line)
    assert ids["alice"] in next(line for line in every if long_run in line)
    assert ids["bob"] in next(line for line in every if bob_run in line)

    # Bob's clone: its logs and its fetch are its own run's, never alice's (the same folder name).
    logs = fab_in(lab, bob, "logs", home=bob_home, check=True).stdout
    assert bob_run in logs and long_run not in logs
    fab_in(lab, bob, "fetch", home=bob_home, check=True)
    assert (bob / "runs" / "lab" / bob_run / ".gpu-train" / "log").is_file()
    assert not (bob / "runs" / "lab" / long_run).exists()
    again = started(fab_in(lab, bob, "train", "--script", "train.py", "--args", f"{NANO} --max_iters=2", home=bob_home, check=True))
    wait_state(lab, again, ("succeeded",))
    pruned = fab_in(lab, bob, "prune", home=bob_home, check=True).stdout
    assert bob_run in pruned and lm_run not in pruned and long_run not in pruned, pruned

    # Alice: a second run of hers: `stop` lists both and stops neither; `resume --run` of a running one refuses.
    second = fab_in(lab, alice, "train", "--script", "train.py", "--name", "second", "--args", f"{NANO} --iter_sleep=0.5", check=True)
    second = started(second)
    wait_state(lab, second, ("running",))
    which = fab_in(lab, alice, "stop")
    assert which.returncode == 2 and f"2 runs of this project are running ({', '.join(sorted((long_run, second)))})" in which.stderr, (
        which.stderr
    )
    assert fab_in(lab, alice, "stop", "--run", second, check=True).stdout.startswith(f"{second}: stopped")
    refused = fab_in(lab, alice, "resume", "--run", long_run)
    assert refused.returncode == 1 and "is still running" in refused.stderr and "--force" in refused.stderr, refused.stderr
    assert recorded(lab, long_run)["state"] == "running" and recorded(lab, long_run)["resumes"] == 0
    out = fab_in(lab, alice, "stop", check=True).stdout  # her one running run
    assert out.startswith(f"{long_run}: stopped"), out
    assert "nothing to stop: no run of this project is running" in fab_in(lab, alice, "stop", check=True).stdout

    # `down` from the Lightning project (an SSH stack): its runs home, the others' stay, and it says what stays.
    down = fab_in(lab, lm, "down", check=True)
    assert (lm / "runs" / "lab" / lm_run / "workdir" / "checkpoints").is_dir()
    assert not (lm / "runs" / "lab" / long_run).exists() and not (lm / "runs" / "lab" / bob_run).exists()
    assert "stays on" in down.stdout and long_run in down.stdout and f"{lab.remote}/envs" in down.stdout, down.stdout


# -- a monorepo of examples, each its own project -----------------------------------------------------
MONO_ADDRESS = "127.0.38.2"


@pytest.fixture
def mono(tmp_path: Path):
    """A monorepo of two real examples, each with its own requirements.txt (a small wheel each, from a local
    index) and its own gitignored data; an SSH stack with a venv per project, made from a Python that has
    torch and Lightning preinstalled (as a Deep Learning image has: here the tests' own packages)."""
    from remote.loopback import Sshd
    from tests.conftest import fab_env
    from tests.pyindex import PackageIndex, make_wheel

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    made = [make_wheel(wheels, "tinypkg", "1.0", {"tinypkg.py": "VALUE = 42\n"})]
    made.append(make_wheel(wheels, "otherpkg", "2.0", {"otherpkg.py": "VALUE = 7\n"}))  # (no uv here: venv and pip install)
    index = PackageIndex(MONO_ADDRESS, made)
    site = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
    sshd = Sshd(tmp_path / "sshd", MONO_ADDRESS, setenv=f"PIP_INDEX_URL={index.url} PYTHONPATH={site}").start()
    remote, stacks, home = tmp_path / "remote", tmp_path / "stacks", tmp_path / "home"
    path = sshd.stack_file(stacks, "lab", remote, sys._base_executable)  # a Python that is no venv: a venv per project
    path.write_text(path.read_text().replace("gpu-train:venv: false", "gpu-train:venv: true"))
    repo = tmp_path / "examples-repo"
    shutil.copytree(PROJECTS / "nanogpt", repo / "examples" / "char_lm", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(PROJECTS / "lightning_trainer", repo / "examples" / "fit", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "examples" / "char_lm" / "requirements.txt").write_text("tinypkg==1.0\n")
    (repo / "examples" / "fit" / "requirements.txt").write_text("otherpkg==2.0\n")
    (repo / "examples" / "fit" / "data").mkdir()
    (repo / "examples" / "fit" / "data" / "table.csv").write_text("x,y\n1,2\n")
    (repo / ".gitignore").write_text("examples/fit/data/\n")
    (repo / "README.md").write_text("# examples\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    env = {k: v for k, v in fab_env(stacks, home, "lab", repo).items() if k != "GPU_TRAIN_PROJECT"}  # found from the cwd

    class Mono:
        repo: Path
        remote: Path
        home: Path

        def fab(self, where: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
            return run_fab(env, where, *args, check=check, timeout=240)

    m = Mono()
    m.repo, m.remote, m.home = repo, remote, home
    yield m
    sshd.stop()
    index.close()
    subprocess.run(["pkill", "-f", str(remote)], check=False)


@pytest.mark.e2e
def test_a_monorepo_example_trains_with_its_own_requirements_and_data_first_time(mono) -> None:
    repo, remote = mono.repo, mono.remote
    char_lm, fit = repo / "examples" / "char_lm", repo / "examples" / "fit"
    subprocess.run([sys.executable, "data/shakespeare_char/prepare.py"], cwd=char_lm, check=True, capture_output=True)

    # From the example's folder: its data, its requirements, its working directory.
    pushed = mono.fab(char_lm, "push", "data")
    char_id, fit_id = project_id(mono.home, char_lm), project_id(mono.home, fit)
    assert f"{remote}/data/{char_id}/data" in pushed.stdout, pushed.stdout
    trained = mono.fab(char_lm, "train", "--script", "train.py", "--args", f"{NANO} --max_iters=3", "--follow")
    run = started(trained)
    assert f"{remote}/envs/{char_id}" in trained.stdout, trained.stdout
    assert list((remote / "envs" / char_id).glob("lib/python3*/site-packages/tinypkg.py")), "its requirements.txt, in its venv"
    assert "iter 2:" in trained.stdout  # it read data/shakespeare_char/*.bin where `push data` put them
    assert (remote / "envs" / char_id / "bin" / "python").exists()

    # From the monorepo's root: the hint's --script examples/fit/train.py is the fit example's own project.
    root_push = mono.fab(repo, "push", "examples/fit/data")
    assert f"{remote}/data/{fit_id}/data" in root_push.stdout, root_push.stdout
    fitted = mono.fab(repo, "train", "--script", "examples/fit/train.py", "--args", "--max_steps 2 --every_n_steps 1", "--follow")
    fit_run = started(fitted)
    assert "project examples/fit (requirements.txt): its code is synced and the job runs there" in fitted.stderr, fitted.stderr
    assert f"{remote}/envs/{fit_id}" in fitted.stdout, fitted.stdout
    assert list((remote / "envs" / fit_id).glob("lib/python3*/site-packages/otherpkg.py")), "its own requirements.txt"
    code = remote / "runs" / fit_run / "code"
    assert (code / "train.py").is_file() and not (code / "examples").exists()  # the example's folder, not the repo
    assert (code / "checkpoints" / "last.ckpt").is_file()  # written in its own working directory
    assert (code / "data" / "table.csv").read_text() == "x,y\n1,2\n"  # pushed from the root, where its job reads it
    assert not list((remote / "envs" / fit_id).glob("lib/python3*/site-packages/tinypkg.py"))  # each its own venv

    # --dir from the root names the same project (its venv unchanged), and the root's status lists both.
    again = mono.fab(repo, "train", "--dir", "examples/char_lm", "--script", "train.py", "--args", f"{NANO} --max_iters=2", "--follow")
    assert "unchanged since the last install" in again.stdout and f"{remote}/envs/{char_id}" in again.stdout, again.stdout
    listed = mono.fab(repo, "status").stdout
    assert run in listed and fit_run in listed and char_id in listed and fit_id in listed
    only_fit = json.loads(mono.fab(fit, "status", "--json").stdout)
    assert [r["id"] for r in only_fit["runs"]] == [fit_run] and only_fit["otherProjectsRuns"] == 2


def test_jupyter_runs_where_the_login_is_root(lab: Lab) -> None:
    """Rented and container GPU boxes log in as root, where Jupyter refuses to start without --allow-root
    ("Running as root is not recommended"); the token and the loopback binding guard it as for any login.
    The tests' sshd logs in as this user: root where the suite runs as root (its CI and workplace)."""
    import os
    import urllib.request

    pytest.importorskip("jupyterlab")
    if os.geteuid() != 0:
        pytest.skip("the login is root only where the tests run as root")
    served = lab.spawn("jupyter", "--json")
    try:
        line = served.stdout.readline()  # type: ignore[union-attr]  # (a PIPE: never None)
        assert line, served.communicate(timeout=60)
        url = json.loads(line)["url"]
        with urllib.request.urlopen(url, timeout=60) as page:
            assert page.status == 200
    finally:
        served.terminate()
        served.wait(60)
