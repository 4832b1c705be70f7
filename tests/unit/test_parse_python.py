"""Python source is parsed through agent.bundle.parse_python, safe from CPython's "SystemError: AST constructor
recursion depth mismatch" (python/cpython#106905: 3.11.0-3.11.7 and 3.12.0-3.12.1 count the AST constructor's
recursion in one global, so a parse run meanwhile, by a finalizer the garbage collector calls inside it or by
another thread, fails it). A CI run failed test_recovery_program's ast.parse so under xdist, on this image's 3.11.7.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, parse_source

SCANNED = ("gpu_train", "agent", "remote", "infra", "bench", "tests")  # (scripts/dev: standalone, one thread)
AFFECTED = (3, 11, 0) <= sys.version_info[:3] <= (3, 11, 7) or (3, 12, 0) <= sys.version_info[:3] <= (3, 12, 1)

# Each scenario parses a big module 40 times while the thing CPython trips on happens; prints the mismatches.
SETUP = """
import ast, asyncio, gc, sys, threading, traceback
from agent.bundle import parse_python
parse = parse_python if sys.argv[1] == "helper" else ast.parse
text = open("infra/gpu_vm.py").read()  # (run from a file: a traceback's lines are read, and parsed, from it)

def error():
    try:
        [1][0].an_attribute_whose_line_3_11_parses_for_its_carets
    except AttributeError as e:
        return e

def parses():
    mismatches = 0
    for _ in range(40):
        make_garbage()
        try:
            parse(text)
        except SystemError as e:
            assert "recursion depth mismatch" in str(e), e
            mismatches += 1
    print(mismatches)
"""
SCENARIOS = {
    # asyncio's report of a future's unread exception, from its finalizer (the Pulumi mocks leave such futures)
    "a finalizer formats a traceback": """
        loop = asyncio.new_event_loop()
        def make_garbage():
            for _ in range(20):
                future = loop.create_future()
                future.set_exception(error())
                cycle = {"future": future}
                cycle["cycle"] = cycle  # freed by the collector, inside whatever allocates then
        parses()
    """,
    # a server's thread printing a traceback while this one's parse runs a finalizer (the GIL changes hands)
    "another thread formats a traceback": """
        class Finalized:
            def __del__(self):
                sum(range(100))
        def make_garbage():
            for _ in range(50):
                a, b = Finalized(), Finalized()
                a.b, b.a = b, a
        def formats():
            e = error()
            while True:
                traceback.format_exception(e)
        threading.Thread(target=formats, daemon=True).start()
        sys.setswitchinterval(1e-6)
        parses()
    """,
}


def mismatches(folder: Path, scenario: str, parse: str) -> int:
    script = folder / "scenario.py"
    script.write_text(SETUP + textwrap.dedent(SCENARIOS[scenario]))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script), parse], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_helper_parses_where_cpythons_constructor_fails(scenario: str, tmp_path: Path) -> None:
    assert mismatches(tmp_path, scenario, "helper") == 0
    if AFFECTED:  # the scenario is the bug's: plain ast.parse fails in it on this Python
        assert mismatches(tmp_path, scenario, "ast.parse") > 0


def plain_parses(tree: ast.Module) -> list[int]:
    """The lines that call ast.parse itself (or import it by name)."""
    return sorted(
        {
            n.lineno
            for n in ast.walk(tree)
            if (isinstance(n, ast.Attribute) and n.attr == "parse" and isinstance(n.value, ast.Name) and n.value.id == "ast")
            or (isinstance(n, ast.ImportFrom) and n.module == "ast" and any(a.name == "parse" for a in n.names))
        }
    )


def test_every_parse_goes_through_the_helper() -> None:
    helper = ROOT / "agent" / "bundle.py"
    found = {
        f"{p.relative_to(ROOT)}:{line}"
        for d in SCANNED
        for p in sorted((ROOT / d).rglob("*.py"))
        if "__pycache__" not in p.parts
        for line in plain_parses(parse_source(p))
    }
    assert [f for f in found if not f.startswith(f"{helper.relative_to(ROOT)}:")] == [], (
        "parse Python with agent.bundle.parse_python (tests: tests.conftest.parse_source), not ast.parse: "
        "CPython 3.11.7's parse fails when another runs meanwhile (python/cpython#106905)"
    )
    assert len([f for f in found if f.startswith("agent/bundle.py:")]) == 1  # the helper's own
