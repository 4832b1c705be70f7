"""Shared fixtures and the test tiers. The real sshd on loopback is remote/loopback.py.

Tiers (markers, registered here; README "Tests" says how to pick them):
  e2e    real sshd, screen, rsync on loopback: every test that uses a fixture in E2E_FIXTURES is marked
         so at collection, and a test outside the tier that starts an sshd fails, so the fast tier stays fast
  guest  a booted systemd guest (tests/guest/, marked by its conftest)
  slow   a long real wait or many real processes (marked where it is)
The fast tier is ``pytest -m "not e2e and not guest and not slow"``.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest

from remote.loopback import Sshd
from tests.pyindex import OFFLINE_INDEX

# Tests send Ctrl-C (SIGINT) to the commands they start. A suite started in the background by a
# non-interactive shell (`scripts/test &`, some CI runners) inherits SIGINT ignored, and an ignored
# signal stays ignored across exec: every command would then shrug Ctrl-C off. Handled here, it is
# back to its default in each command the tests start (exec resets handled signals).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent
# Python keeps compiled modules for its users; a workplace that sets PYTHONDONTWRITEBYTECODE (this one,
# some CI images) makes each of the thousands of `fab`s the tests start compile gpu-train anew (about
# 0.06 s of CPU each time). Without it, the commands the tests start keep them as users' do: gpu-train's
# beside its sources (__pycache__/, ignored by git), and the packages' where pip put them at install.
# (A separate cache folder, as PYTHONPYCACHEPREFIX gives, would start empty on a fresh machine and have
# the first commands compile torch, Fabric and pulumi-gcp anew, several at once: 3 s of CPU for torch.)
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) and "PYTEST_XDIST_WORKER" not in os.environ:
    shutil.rmtree(Path.home() / ".cache" / "gpu-train" / "test-pycache", ignore_errors=True)  # where earlier versions kept them
# Torch jobs the tests run here (a reference run, torchrun nodes) share two cores with the other
# tests: one OpenMP thread each, or their idle threads spin against the rest (loopback sshd's
# sessions say the same).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Fixtures that start a real sshd (here and in the test modules): a test using one is `e2e`.
E2E_FIXTURES = frozenset({"lab", "duo", "host", "sshd_host", "pool_cluster", "sshd", "trio", "blind_lab", "pair", "bucket_lab"})
# Fixtures whose tests run many real processes (scripts/up against the stand-in pulumi): `slow`.
SLOW_FIXTURES = frozenset({"up_env"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "guest: boots a real systemd guest with systemd-nspawn (root); tests/guest/")
    config.addinivalue_line("markers", "e2e: runs against a real sshd, screen and rsync on loopback")
    config.addinivalue_line("markers", "slow: a long real wait or many real processes; left out of the fast tier")
    config.addinivalue_line("markers", "long: takes a minute or more (any tier): started first under xdist")


# A test's folder is its tier (scripts/dev/tiers.py moved them there): tests/unit/ holds the fast tier.
# The heaviest marker a test has names its folder.
TIERS = ("guest", "e2e", "slow", "unit")


def tier_of(item: pytest.Item) -> str:
    """The tier a collected test belongs to, by its markers (the heaviest it has); `unit` when none.
    (tests/guest/conftest.py marks its tests `guest`, maybe after this conftest's hook ran.)"""
    if item.nodeid.startswith("tests/guest/"):
        return "guest"
    return next((tier for tier in TIERS[:-1] if item.get_closest_marker(tier)), "unit")


def folder_tier(item: pytest.Item) -> str | None:
    """The tier folder a test lives in (tests/TIER/...), None at the top of tests/."""
    parts = item.nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    misplaced = [f"{item.nodeid} ({tier_of(item)})" for item in items if folder_tier(item) not in (None, tier_of(item))]
    if misplaced:
        raise pytest.UsageError(
            "tests in another tier's folder: move each to tests/TIER/ (or change what it uses):\n  " + "\n  ".join(misplaced)
        )
    # Longest first: the suite's wall time is its busiest xdist worker's, so the long tests start at
    # once and the quick tables fill in at the end (not one long test starting last).
    items.sort(
        key=lambda item: (
            0
            if item.get_closest_marker("long")
            else 1
            if item.get_closest_marker("guest") or "guest" in item.nodeid.split("/")[:2]
            else 2
            if item.get_closest_marker("slow")
            else 3
            if item.get_closest_marker("e2e")
            else 4
        )
    )
    gc.freeze()  # what collection imported lives as long as the worker: full collections no longer walk it (2-4 s of CPU)


@pytest.fixture(autouse=True)
def _umask_kept():
    """The agent sets umask 077 for its whole process (agent/guard.py); a test that calls it in
    pytest's process must not pass that on: files later tests write would be unreadable to the other
    users they start (test_other_users failed after test_remote_root_guard, by test order)."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


@pytest.fixture(autouse=True)
def _sshd_only_in_e2e(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test outside the e2e tier that starts a real sshd fails, saying how to fix it."""
    if request.node.get_closest_marker("e2e") or request.node.get_closest_marker("guest"):
        return
    # (A test that starts one in its body says @pytest.mark.e2e.)

    def refuse(self: Sshd) -> Sshd:
        raise AssertionError(
            f"{request.node.nodeid} starts a real sshd: use a fixture in tests/conftest.py "
            "E2E_FIXTURES (or add yours there), so that it is marked e2e"
        )

    monkeypatch.setattr(Sshd, "start", refuse)


@pytest.fixture
def gcs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A real storage emulator (gcp-storage-emulator) holding bucket "ckpt", found by Google's clients
    through STORAGE_EMULATOR_HOST, as on a host."""
    from tests.gcs import Emulator

    emu = Emulator("ckpt", tmp_path / "emulator.log")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.url)
    yield emu
    emu.stop()


@pytest.fixture(scope="session")
def public_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway key pair; the path of its public half."""
    d = tmp_path_factory.mktemp("keys")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "id_ed25519")], check=True)
    return d / "id_ed25519.pub"


def gcp_raw(**overrides: object) -> dict[str, object]:
    """Raw settings of a valid GCP stack (1 x T4 on n1-standard-8), with overrides by bare key."""
    raw: dict[str, object] = {
        "gcp:project": "proj-1",
        "gpu-train:zone": "us-central1-a",
        "gpu-train:machineType": "n1-standard-8",
        "gpu-train:gpuType": "nvidia-tesla-t4",
        "gpu-train:gpuCount": 1,
        "gpu-train:sshSourceRanges": ["10.1.2.3/32"],  # not a documentation range: those are warned about
        "gpu-train:sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests user@host",
    }
    for k, v in overrides.items():
        key = k if ":" in k else f"gpu-train:{k}"
        if v is None:
            raw.pop(key, None)
        else:
            raw[key] = v
    return raw


# -- the lab: an SSH stack on a throwaway sshd, driven through the real `fab` ------------------
FAB = str(Path(sys.executable).parent / "fab")
EXAMPLE = ROOT / "examples"


@pytest.fixture
def plain(tmp_path: Path) -> str:
    """A code folder with no requirements.txt, for jobs given by --command: the example's folder would
    have the host check its requirements with pip (1.4 s of CPU a run) for a test about something else."""
    code = tmp_path / "plain"
    code.mkdir()
    (code / "README").write_text("a job given by --command\n")
    return str(code)


@pytest.fixture
def example(tmp_path: Path) -> str:
    """The example's train.py in a folder of its own without its requirements.txt, for tests about what
    the example does (checkpoints, signals, resumes): with it, each test's fresh host would check with
    pip first. The whole example, requirements and all, is test_train_follow_status_fetch_the_example's."""
    code = tmp_path / "example"
    code.mkdir()
    shutil.copy2(EXAMPLE / "train.py", code / "train.py")
    return str(code)


def fab_env(stacks: Path, home: Path, stack: str, project: Path) -> dict[str, str]:
    """The environment a test runs `fab` in: its own stacks, caches and project, nothing of the user's."""
    return {
        **os.environ,
        "GPU_TRAIN_STACKS_DIR": str(stacks),
        "GPU_TRAIN_HOME": str(home),
        "GPU_TRAIN_STACK": stack,
        "PYTHONPATH": str(ROOT),
        "GPU_TRAIN_PROJECT": str(project),
    }


def in_process(main: Callable[[list[str]], int], argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``main(argv)`` of scripts/up or scripts/plan run here as the script runs it in a process of its own:
    the environment ``env``, stdin at its end (no terminal), stdout and stderr captured, SystemExit as the
    exit status. Each such process spends about a second of CPU importing pulumi-gcp before it does
    anything; a test worker imports it once. (Each script is still also run as a user runs it.)"""
    saved = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        with (
            open(os.devnull) as nothing,
            mock.patch.object(sys, "stdin", nothing),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse's errors; a message as the code is printed, as Python does
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        # What the Pulumi program under mocks left (a failed registration's futures), collected now and
        # quietly: collected later, inside another test, asyncio logs each with its traceback, and
        # CPython 3.11 formats one by parsing source, which broke that test's own ast.parse once.
        from infra.ops.preview import forget_failed_tasks

        forget_failed_tasks()
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def parse_source(path: Path) -> ast.Module:
    """ast.parse with the garbage collector held: a finalizer that formats a traceback (asyncio's report
    of a future's unread exception) parses source too, and CPython 3.11 then fails the outer parse with
    "SystemError: AST constructor recursion depth mismatch"."""
    gc.disable()
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    finally:
        gc.enable()


def run_fab(env: dict[str, str], cwd: Path, *args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    """`fab ARGS` as a user runs it (no stdin); ``check``: a failure is the test's, with fab's output."""
    result = subprocess.run(
        [FAB, "--search-root", str(ROOT), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"fab {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def after_the_second_of(run_id: str) -> None:
    """Wait until the clock has left the second ``run_id`` was named in (NAME_YYYYmmdd_HHMMSS): a train of
    the same name then gets a new run id, not a refusal (the condition a fixed sleep of 1.1 s stood in for)."""
    while time.strftime("%Y%m%d_%H%M%S") <= run_id[-15:]:
        time.sleep(0.01)


def cluster_stack(stacks: Path, name: str, hosts: list[str], key: str | Path, extra: str = "") -> Path:
    """An SSH stack over several hosts, node N's REMOTE_ROOT in ``stacks/../nodeN``; jobs run in the
    tests' own Python as it is (venv: false)."""
    stacks.mkdir(parents=True, exist_ok=True)
    path = stacks / f"Pulumi.{name}.yaml"
    path.write_text(
        f"config:\n  gpu-train:target: ssh\n  gpu-train:hosts: {json.dumps(hosts)}\n  gpu-train:sshKey: {key}\n"
        f"  gpu-train:remoteRoot: {stacks.parent}/node{{node}}\n  gpu-train:python: {sys.executable}\n"
        f"  gpu-train:venv: false\n{extra}"
    )
    return path


def project_id(state_home: Path, folder: Path) -> str:
    """The id of the project ``folder`` in the laptop state ``state_home`` (made as gpu-train makes it)."""
    from gpu_train.identity import ProjectIds

    return ProjectIds(state_home).id_for(folder)


class Lab:
    """An SSH stack named `lab` on a throwaway sshd, and a way to run fab against it."""

    def __init__(self, tmp: Path, address: str = "127.0.0.2", setenv: str = ""):
        self.tmp = tmp
        self.sshd = Sshd(tmp / "sshd", address, setenv=f"PIP_INDEX_URL={OFFLINE_INDEX} {setenv}".strip()).start()  # no internet
        self.remote = tmp / "remote"
        self.stacks = tmp / "stacks"
        self.home = tmp / "home"
        self.cwd = tmp / "work"
        self.cwd.mkdir()
        self.sshd.stack_file(self.stacks, "lab", self.remote, sys.executable)

    @property
    def env(self) -> dict[str, str]:
        return fab_env(self.stacks, self.home, "lab", self.cwd)

    def fab(self, *args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
        return run_fab(self.env, self.cwd, *args, check=check, timeout=timeout)

    def spawn(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [FAB, "--search-root", str(ROOT), *args],
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )

    def train(self, *args: str) -> str:
        out = self.fab("train", *args, check=True).stdout
        return out.split()[1]  # "started RUN_ID on ..."

    def status(self) -> dict:
        return json.loads(self.fab("status", "--json", check=True).stdout)

    def run_state(self, run: str) -> dict:
        return next(r for r in self.status()["runs"] if r["id"] == run)

    def wait(self, run: str, states=("succeeded", "failed", "stopped", "interrupted"), timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = json.loads((self.remote / "runs" / run / "state.json").read_text())
            if state.get("state") in states:
                return self.run_state(run)
            time.sleep(0.2)
        raise AssertionError(f"{run} did not reach {states}")

    def end_shared_connection(self) -> None:
        """Close this user's shared OpenSSH connection to the lab host (remote/ssh/mux.py)."""
        from gpu_train.environment import Environment
        from remote.ssh import mux
        from remote.ssh.target import resolve

        target = resolve(Environment.from_os(self.env), "lab").for_node(0)
        mux.end_master(target, target.host)

    def log(self, run: str) -> str:
        path = self.remote / "runs" / run / "log"
        return path.read_text() if path.exists() else ""


@pytest.fixture
def lab(request: pytest.FixtureRequest, tmp_path: Path):
    """A Lab on the test module's LAB_ADDRESS (each suite its own loopback addresses), else 127.0.0.2."""
    lab = Lab(tmp_path, getattr(request.module, "LAB_ADDRESS", "127.0.0.2"))
    yield lab
    lab.sshd.stop()
    subprocess.run(["pkill", "-f", str(lab.remote)], check=False)  # jobs left running by a failed test


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The parallel fetch's loopback host (tests/fetch_host.py). Pieces from 64 KiB are written directly
    (remote/transfer/fetch/direct.py) where the test's folder is on a local disk, so the fetch tests cover both ways."""
    from remote.transfer.fetch import direct as fetch_direct
    from tests.fetch_host import Host

    monkeypatch.setattr(fetch_direct, "DIRECT_MIN", 64 * 1024)
    h = Host(tmp_path)
    yield h
    h.sshd.stop()


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges at test sizes: files over 1 MiB travel in 256 KiB ranges."""
    from remote.transfer.fetch import generator as fp

    monkeypatch.setattr(fp, "SPLIT_BYTES", 1 << 20)
    monkeypatch.setattr(fp, "RANGE_BYTES", 256 * 1024)
