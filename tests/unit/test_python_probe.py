"""The job's Python on a host is found by probing candidates for `import torch` (real interpreters:
the system's python3 has no torch, this project's venv has torch 2.13 CPU), not assumed at /opt/conda."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from agent import procs

WITH_TORCH = sys.executable  # the test venv's Python: torch is installed
WITHOUT_TORCH = shutil.which("python3", path="/usr/bin") or "/usr/bin/python3"


@pytest.fixture(scope="module", autouse=True)
def _interpreters() -> None:
    # WITH_TORCH is this process's own Python: finding torch here costs nothing, importing it in a new
    # process 2 s of CPU in every xdist worker that runs a test of this module (the tests import it).
    if procs.imports_torch(WITHOUT_TORCH) or importlib.util.find_spec("torch") is None:
        pytest.fail("needs a system python3 without torch and the test venv with it")


@pytest.mark.parametrize(
    ("candidates", "expected"),
    [
        ([WITHOUT_TORCH, WITH_TORCH], WITH_TORCH),  # the first that imports torch, not the first that exists
        (["/nonexistent/opt/conda/bin/python", WITH_TORCH], WITH_TORCH),
        ([WITHOUT_TORCH], WITHOUT_TORCH),  # none has torch: the first that runs (the job may not need it)
        (["/nonexistent/python"], sys.executable),
    ],
)
def test_detect_python_probes_for_torch(candidates: list[str], expected: str) -> None:
    assert procs.detect_python(None, candidates) == expected


def test_a_configured_python_wins(tmp_path: Path) -> None:
    assert procs.detect_python("~/envs/x/bin/python", [WITH_TORCH]) == str(Path("~/envs/x/bin/python").expanduser())


def test_the_default_candidates_are_real_executables_each_once() -> None:
    found = procs.python_candidates()
    assert found and len({Path(c).resolve() for c in found}) == len(found)
