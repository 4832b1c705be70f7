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

    root, imported = tmp_path / "root", tmp_path / "imported"
    (init,) = (Path(WITH_TORCH).parent.parent / "lib").glob("python3*/site-packages/torch/__init__.py")
    init.write_text(f"open({str(imported)!r}, 'a').write('x\\n')\n__version__ = '2.13.0'\n")

    def imports() -> int:
        return len(imported.read_text().splitlines()) if imported.exists() else 0

    assert launch.check_python(str(root), WITH_TORCH, True, True) is False  # a venv: not externally managed
    assert imports() == 1
    assert procs.detect_python(None, [WITHOUT_TORCH, WITH_TORCH], lambda c: launch.imports_torch_probed(str(root), c)) == WITH_TORCH
    assert launch.check_python(str(root), WITH_TORCH, True, True) is False
    assert imports() == 1  # found, then checked, without importing torch again
    init.write_text(init.read_text().replace("2.13.0", "2.14.0"))  # torch upgraded
    launch.check_python(str(root), WITH_TORCH, True, True)
    assert imports() == 2
    with pytest.raises(launch.AgentError, match="cannot `import torch`") as refused:  # a failure is never kept
        launch.check_python(str(root), WITHOUT_TORCH, True, True)
    assert "list torch in requirements.txt (or, without one, pyproject.toml's dependencies or its uv.lock)" in str(refused.value)
    with pytest.raises(launch.AgentError, match="cannot `import torch`"):
        launch.check_python(str(root), WITHOUT_TORCH, True, True)


def test_a_shim_is_asked_every_time(tmp_path: Path) -> None:
    """A pyenv or asdf shim (a script) picks its interpreter as it runs: `pyenv global system` makes the
    same path a Python without torch, so what it answered before says nothing now."""
    from agent import launch

    root, choice = tmp_path / "root", tmp_path / "choice"
    shim = tmp_path / "python"
    shim.write_text(f'#!/bin/sh\nexec "$(cat {choice})" "$@"\n')
    shim.chmod(0o755)
    choice.write_text(WITH_TORCH)
    launch.check_python(str(root), str(shim), True, True)
    choice.write_text(WITHOUT_TORCH)  # `pyenv global system`
    with pytest.raises(launch.AgentError, match="cannot `import torch`"):
        launch.check_python(str(root), str(shim), True, True)
