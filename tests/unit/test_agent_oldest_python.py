"""The agent runs on Python 3.8, the oldest Python a host may have: what this tier checks of that promise,
and how.

No Python 3.8 is to be had from the registries this project installs from (PyPI ships no CPython
interpreter; Debian's bookworm has 3.11 alone; building one needs python.org's sources), so
scripts/test cannot provide one. What is checked here, on every machine, is what can be read from the
sources: every file the zipapp carries (agent/bundle.py's, the carried core modules included) parses
with Python 3.8's grammar (``ast.parse(feature_version=(3, 8))``), and uses nothing of the language or the
standard library newer than 3.8 (vermin, the minimum-version detector, pinned in requirements-test.txt;
annotations are not evaluated on the host: ``from __future__ import annotations`` everywhere, the codec
reads them as text, and what is imported under ``if TYPE_CHECKING:`` alone is left out). Where a machine
has a real 3.8 (on PATH, or pyenv's, as this workplace's image has), tests/e2e/test_agent_bundle.py also
launches a run with the zipapp under it; elsewhere it says it skipped.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent import bundle
from tests.conftest import parse_source

VERMIN = shutil.which("vermin", path=str(Path(sys.executable).parent))


def shipped() -> list[Path]:
    """Every source file the zipapp carries."""
    return [p for p in sorted(bundle.HERE.glob("*.py")) if p.name not in bundle.LAPTOP_ONLY] + [bundle.CORE / n for n in bundle.CARRIED]


def for_the_checker_only(*files: Path) -> list[str]:
    """What ``files`` import under ``if TYPE_CHECKING:`` (module.name): never imported on a host."""
    found = []
    for path in files:
        for node in ast.walk(parse_source(path)):
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                found += [f"{i.module}.{a.name}" for i in node.body if isinstance(i, ast.ImportFrom) for a in i.names]
    return found


def too_new(*files: Path) -> tuple[int, str]:
    """vermin's exit status and report for ``files`` against Python 3.8 (1: something needs a newer one)."""
    assert VERMIN, "vermin is in requirements-test.txt"
    excluded = [arg for name in for_the_checker_only(*files) for arg in ("--exclude", name)]
    out = subprocess.run(
        [VERMIN, "-t=3.8-", "--no-tips", "--violations", *excluded, *map(str, files)], capture_output=True, text=True, timeout=120
    )
    return out.returncode, out.stdout + out.stderr


def test_every_file_the_zipapp_carries_parses_as_python_3_8() -> None:
    files = shipped()
    assert {"cli.py", "launch.py", "contract.py", "codec.py"} <= {p.name for p in files}
    for path in files:
        bundle.parse_python(path.read_text(encoding="utf-8"), str(path), feature_version=(3, 8))
    with pytest.raises(SyntaxError):  # (what the grammar check catches: a 3.10 match statement)
        bundle.parse_python("match x:\n    case 1:\n        pass\n", feature_version=(3, 8))


def test_nothing_the_zipapp_carries_needs_more_than_python_3_8() -> None:
    status, report = too_new(*shipped())
    assert status == 0 and "Minimum required versions: 3.8" in report, report


@pytest.mark.parametrize(
    ("source", "needs"),
    [
        ("import zoneinfo\n", "'zoneinfo' module requires !2, 3.9"),
        ('x = "ab".removeprefix("a")\n', "'str.removeprefix' member requires !2, 3.9"),
        ("import functools\n\n@functools.cache\ndef f():\n    pass\n", "'functools.cache' member requires !2, 3.9"),
        ("import itertools\n\nx = itertools.pairwise([1, 2])\n", "'itertools.pairwise' member requires !2, 3.10"),
        ("from typing import TypeGuard\n", "'typing.TypeGuard' member requires !2, 3.10"),  # (outside TYPE_CHECKING)
    ],
)
def test_the_version_check_refuses_what_3_8_lacks(tmp_path: Path, source: str, needs: str) -> None:
    (tmp_path / "newer.py").write_text(source)
    status, report = too_new(tmp_path / "newer.py")
    assert status == 1 and needs in report and "Target versions not met:   3.8-" in report, report
