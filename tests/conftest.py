"""The test tiers, and every shared fixture (by concept in tests/fixtures/: the lab on a real sshd on loopback,
remote/loopback.py; GCP's settings, the storage emulator and the scripts in process; the checkout's sources).

Tiers (markers, registered here; README "Tests" says how to pick them):
  e2e    real sshd, screen, rsync on loopback: every test that uses a fixture in E2E_FIXTURES is marked
         so at collection, and a test outside the tier that starts an sshd fails, so the fast tier stays fast
  guest  a booted systemd guest (tests/guest/, marked by its conftest)
  slow   a long real wait or many real processes (marked where it is)
The fast tier is ``pytest -m "not e2e and not guest and not slow"``.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
from pathlib import Path

import pytest

from remote.loopback import Sshd

pytest.register_assert_rewrite("tests.fixtures")  # (as in a conftest: a failed assert there says its values)
# The fixtures (pytest finds them in this module's names) and the helpers tests import from here.
from tests.fixtures.gcp import gcp_raw, gcs, in_process, public_key  # noqa: E402
from tests.fixtures.sshd import (  # noqa: E402
    EXAMPLE,
    FAB,
    Lab,
    after_the_second_of,
    cluster_stack,
    example,
    fab_env,
    host,
    lab,
    plain,
    project_id,
    run_fab,
    small_ranges,
)
from tests.fixtures.tree import ROOT, parse_source  # noqa: E402

__all__ = [
    "EXAMPLE",
    "FAB",
    "ROOT",
    "Lab",
    "after_the_second_of",
    "cluster_stack",
    "example",
    "fab_env",
    "gcp_raw",
    "gcs",
    "host",
    "in_process",
    "lab",
    "parse_source",
    "plain",
    "project_id",
    "public_key",
    "run_fab",
    "small_ranges",
]

# Tests send Ctrl-C (SIGINT), a process manager's SIGTERM and a closed terminal's SIGHUP to the commands
# they start. A suite started in the background by a non-interactive shell (`scripts/test &`, some CI
# runners) inherits SIGINT ignored, one under `nohup` SIGHUP, and an ignored signal stays ignored across
# exec: every command would then shrug it off (gpu-train leaves a signal ignored as it found it, as a
# `nohup gpu-train ...` asks). Handled or at its default here, it is at its default in each command the
# tests start (exec resets handled signals).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
for _stop in (signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(_stop) is signal.SIG_IGN:
        signal.signal(_stop, signal.SIG_DFL)

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
