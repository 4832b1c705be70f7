"""The job's Python on a host is found by probing candidates for `import torch` (real interpreters: the
system's python3 has no torch; a venv of it holds a package named torch, as an image's framework
Python holds the real one), not assumed at /opt/conda.

The probe is `python -c "import torch"`: what it tells apart is whether the import succeeds, so the torch
here is an empty package: the real one costs 2 s of CPU each import (the e2e tier's jobs import it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent import procs

WITHOUT_TORCH = shutil.which("python3", path="/usr/bin") or "/usr/bin/python3"
WITH_TORCH = ""  # a venv of it with a torch package: made by _interpreters


@pytest.fixture(scope="module", autouse=True)
def _interpreters(tmp_path_factory: pytest.TempPathFactory) -> None:
    global WITH_TORCH
    venv = tmp_path_factory.mktemp("torch-venv")
    subprocess.run([WITHOUT_TORCH, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "torch").mkdir(parents=True)
    (Path(site) / "torch" / "__init__.py").write_text("__version__ = '2.13.0'\n")
    WITH_TORCH = str(venv / "bin" / "python")
    if procs.imports_torch(WITHOUT_TORCH) or not procs.imports_torch(WITH_TORCH):
        pytest.fail("needs a system python3 without torch (and its venv module)")


@pytest.mark.parametrize(
    ("candidates", "expected"),
    [
        (["without", "with"], "with"),  # the first that imports torch, not the first that exists
        (["/nonexistent/opt/conda/bin/python", "with"], "with"),
        (["without"], "without"),  # none has torch: the first that runs (the job may not need it)
        (["/nonexistent/python"], sys.executable),
    ],
)
def test_detect_python_probes_for_torch(candidates: list[str], expected: str) -> None:
    named = {"with": WITH_TORCH, "without": WITHOUT_TORCH}
    assert procs.detect_python(None, [named.get(c, c) for c in candidates]) == named.get(expected, expected)


def test_a_configured_python_wins(tmp_path: Path) -> None:
    assert procs.detect_python("~/envs/x/bin/python", [WITH_TORCH]) == str(Path("~/envs/x/bin/python").expanduser())


def test_the_default_candidates_are_real_executables_each_once() -> None:
    found = procs.python_candidates()
    assert found and len({Path(c).resolve() for c in found}) == len(found)


def test_a_python_that_passed_is_not_asked_again_while_it_is_the_same(tmp_path: Path) -> None:
    """Every launch checked that the job's Python imports torch (seconds with the real one), unchanged
    code too; a Python that passed is now asked again only when it, or torch's package, changed."""
    from agent import launch

    root, asked = tmp_path / "root", tmp_path / "asked"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\necho x >> {asked}\nexec {WITH_TORCH} "$@"\n')
    wrapper.chmod(0o755)

    def times() -> int:
        return len(asked.read_text().splitlines()) if asked.exists() else 0

    assert launch.check_python(str(root), str(wrapper), True, True) is False  # a venv: not externally managed
    assert times() == 1
    assert procs.detect_python(None, [WITHOUT_TORCH, str(wrapper)], lambda c: launch.imports_torch_probed(str(root), c)) == str(wrapper)
    assert launch.check_python(str(root), str(wrapper), True, True) is False
    assert times() == 1  # found, then checked, without asking it again
    torch_init = Path(WITH_TORCH).parent.parent / "lib"
    (init,) = torch_init.glob("python3*/site-packages/torch/__init__.py")
    init.write_text("__version__ = '2.14.0'\n")  # torch upgraded
    launch.check_python(str(root), str(wrapper), True, True)
    assert times() == 2
    launch.check_python(str(root), str(wrapper), True, False)  # a job that needs no torch: its own record
    assert times() == 3
    with pytest.raises(launch.AgentError, match="cannot `import torch`"):  # a failure is never kept
        launch.check_python(str(root), WITHOUT_TORCH, True, True)
    with pytest.raises(launch.AgentError, match="cannot `import torch`"):
        launch.check_python(str(root), WITHOUT_TORCH, True, True)
