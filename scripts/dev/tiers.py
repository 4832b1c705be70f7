#!/usr/bin/env python3
"""Move the test modules at the top of tests/ into folders by tier (issue 26): tests/unit, tests/e2e,
tests/slow (tests/guest exists), the tier of each test being its heaviest marker (tests/conftest.py
`tier_of`, which also fails a test later found in another tier's folder).

A module whose tests are of one tier moves whole (git mv). A mixed one keeps its lightest tier's tests
and the helpers every tier uses; the other tests go to a module of the same name in their tier's
folder, with the helpers only they use, and import the rest from it. Then every `tests.test_x` import
and every `tests/test_x.py[::name]` named in the repository's text follows, and `ruff check --fix`
drops the imports a module no longer uses and sorts them. Shared helpers (conftest.py, gcs.py,
google_fake.py, fetch_host.py, pyindex.py, webhook.py, stand_in/, real_projects/) stay where they are.

Run from the repository's root, on a clean tree: `python scripts/dev/tiers.py` (`--dry-run`: the plan
only). Safe to re-run: a later run moves only what is at the top of tests/ again (modules added since),
and says what it could not classify (no test collected, or a collection error) and leaves it there.
It ends by collecting the suite again: the same number of tests, or it says so and exits 1.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from splitmodule import LIGHTEST_FIRST, bound_names, split  # (beside this script)

from gpu_train.errors import ExitStatus, GpuTrainError, UsageError, leave

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
TEXT_SUFFIXES = {".py", ".md", ".sh", ".yml", ".yaml", ".toml", ".txt", ".cfg", ".ini", ""}
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", "site", "real_projects"}

COLLECT = r"""
import json, sys
import pytest

class Tiers:
    def __init__(self):
        self.items, self.errors = [], []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        from tests.conftest import tier_of
        self.items = [(item.nodeid, tier_of(item)) for item in items]

    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append(report.nodeid)

    def pytest_runtest_logreport(self, report):  # --setup-plan: a fixture not found
        if report.failed:
            self.errors.append(report.nodeid)

plugin = Tiers()
how = sys.argv[2:] or ["--collect-only"]
code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", *how], plugins=[plugin])
json.dump({"items": plugin.items, "errors": plugin.errors, "code": int(code)}, open(sys.argv[1], "w"))
"""


def collect(*args: str) -> dict:
    """Every test pytest collects with its tier, and the files that failed to collect."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "items.json"
        subprocess.run([sys.executable, "-c", COLLECT, str(out), *args], cwd=ROOT, stdout=subprocess.DEVNULL, check=False)
        if not out.exists():
            raise GpuTrainError("tiers: pytest --collect-only did not run")
        return json.loads(out.read_text())


# -- references elsewhere ------------------------------------------------------------------------
def top_names(path: Path) -> set[str]:
    try:
        return {n for node in ast.parse(path.read_text(encoding="utf-8")).body for n in bound_names(node)}
    except (SyntaxError, OSError):
        return set()


def locate(stem: str, names: set[str] = frozenset()) -> str | None:
    """The tier folder now holding tests/TIER/STEM.py: the one that binds ``names``, else the lightest."""
    found = [t for t in LIGHTEST_FIRST if (TESTS / t / f"{stem}.py").exists()]
    for tier in found:
        if names and names <= top_names(TESTS / tier / f"{stem}.py"):
            return tier
    return found[0] if found else None


def rewrite_imports(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    lines = text.splitlines(keepends=True)
    changed = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and re.fullmatch(r"tests\.test_\w+", node.module):
            stem = node.module.split(".")[1]
            if (TESTS / f"{stem}.py").exists():
                continue
            tier = locate(stem, {a.name for a in node.names})
            if tier is None:
                continue
            for n in range(node.lineno - 1, node.end_lineno or node.lineno):
                new = lines[n].replace(f"tests.{stem} ", f"tests.{tier}.{stem} ")
                changed |= new != lines[n]
                lines[n] = new
    if changed:
        path.write_text("".join(lines), encoding="utf-8")
    return changed


PATH_REF = re.compile(r"(?<![\w/.])tests/(test_\w+)(\.py)?(::(\w+))?")


def rewrite_paths(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")

    def new(m: re.Match) -> str:
        stem = m.group(1)
        if (TESTS / f"{stem}.py").exists():
            return m.group(0)
        tier = locate(stem, {m.group(4)} if m.group(4) else set())
        return m.group(0) if tier is None else m.group(0).replace(f"tests/{stem}", f"tests/{tier}/{stem}", 1)

    out = PATH_REF.sub(new, text)
    if out != text:
        path.write_text(out, encoding="utf-8")
    return out != text


def follow_moves(touched: list[Path]) -> None:
    """Imports of moved modules, and their paths named in text, where they are now. (Not in requirements
    files: scripts/_venv.sh reinstalls the venv when their bytes change; a stale path there is only said.)"""
    for path in text_files():
        if path.name.startswith("requirements"):
            if any(not (TESTS / f"{m.group(1)}.py").exists() for m in PATH_REF.finditer(path.read_text(encoding="utf-8"))):
                print(f"tiers: {path.relative_to(ROOT)} names a moved test module (left as it is)", file=sys.stderr)
            continue
        imports = path.suffix == ".py" and rewrite_imports(path)
        if (rewrite_paths(path) or imports) and path.suffix == ".py" and path not in touched:
            touched.append(path)


def text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / p for p in listed if not SKIP_DIRS & set(Path(p).parts) and Path(p).suffix in TEXT_SUFFIXES and (ROOT / p).is_file()]


TESTING_SECTION = "\n" + (Path(__file__).parent / "tiers.md").read_text(encoding="utf-8")  # docs/testing.md's new section
TEXT_EDITS = [  # (file, text there before the move, the same text after it); each applied once
    (
        "docs/testing.md",
        "The tests come in tiers (pytest markers, declared in `tests/conftest.py`).",
        "The tests come in tiers (pytest markers, declared in `tests/conftest.py`), a folder each (below).",
    ),
    ("docs/testing.md", None, TESTING_SECTION),
    (
        "docs/architecture.md",
        "| the tests (`tests/guest/`: the booted-guest tier) and the benchmarks |",
        "| the tests, a folder per tier (`unit/` the fast tier, `e2e/` a real sshd on loopback, `slow/` scripts/up "
        "and plan, `guest/` a booted systemd guest; docs/testing.md), the helpers they share at the top; the benchmarks |",
    ),
    (
        "CONTRIBUTING.md",
        "A new behaviour's test fails on the old code.\n",
        "A new behaviour's test fails on the old code.\nA test goes in its tier's folder (`tests/unit/`, `e2e/`, "
        '`slow/`, `guest/`: docs/testing.md, "Where a test goes").\n',
    ),
]


def edit_texts() -> None:
    for rel, old, new in TEXT_EDITS:
        path = ROOT / rel
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        if new.strip() in text:
            continue
        if old is None:
            path.write_text(text.rstrip("\n") + "\n" + new, encoding="utf-8")
        elif old in text:
            path.write_text(text.replace(old, new, 1), encoding="utf-8")
        else:
            print(f"tiers: {rel} no longer says {old.strip()!r}: say there that the tests are in tier folders", file=sys.stderr)


FILE_PATHS = [  # a module one folder deeper: paths it made from its own place
    ("Path(__file__).resolve().parent.parent", "Path(__file__).resolve().parents[2]"),
    ("Path(__file__).parent.parent", "Path(__file__).parents[2]"),
    ("Path(__file__).parent /", "Path(__file__).parents[1] /"),
]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    args = ap.parse_args(argv)
    touched: list[Path] = []
    if not args.dry_run:  # a module added since the last run may import one moved then
        follow_moves(touched)
    before = collect()
    if before["errors"]:
        print("tiers: could not classify (collection failed): " + ", ".join(before["errors"]), file=sys.stderr)
    per_file: dict[str, dict[str, str]] = defaultdict(dict)
    for nodeid, tier in before["items"]:
        file, _, rest = nodeid.partition("::")
        name = rest.split("::")[0].split("[")[0]
        known = per_file[file].get(name)
        if known is None or LIGHTEST_FIRST.index(tier) > LIGHTEST_FIRST.index(known):
            per_file[file][name] = tier
    tops = sorted(TESTS.glob("test_*.py"))
    # Names other modules import from each test module: they stay in it.
    wanted: dict[str, set[str]] = defaultdict(set)
    for f in TESTS.rglob("*.py"):
        if "real_projects" in f.parts:
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests.test_"):
                wanted[node.module.split(".")[1]] |= {a.name for a in node.names}
    unclassified, plan = [], {}
    for f in tops:
        rel = f"tests/{f.name}"
        tiers = per_file.get(rel)
        if not tiers or rel in before["errors"]:
            unclassified.append(rel)
            continue
        plan[f] = tiers
        counts = defaultdict(int)
        for t in tiers.values():
            counts[t] += 1
        print(f"{rel}: " + ", ".join(f"{n} {t}" for t, n in sorted(counts.items(), key=lambda c: LIGHTEST_FIRST.index(c[0]))))
    if unclassified:
        print("tiers: left where they are (no test collected, or it failed to collect): " + ", ".join(unclassified), file=sys.stderr)
    if args.dry_run:
        return ExitStatus.OK
    for f, tiers in plan.items():
        texts = split(f, tiers, wanted.get(f.stem, set()))
        for i, (tier, text) in enumerate(sorted(texts.items(), key=lambda t: LIGHTEST_FIRST.index(t[0]))):
            folder = TESTS / tier
            folder.mkdir(exist_ok=True)
            (folder / "__init__.py").touch()
            target = folder / f.name
            if target.exists():
                raise UsageError(f"tiers: {target.relative_to(ROOT)} exists already; {f.relative_to(ROOT)} stays (rename one)")
            if i == 0:  # the home module: git keeps its history
                subprocess.run(["git", "mv", str(f), str(target)], cwd=ROOT, check=True)
            for old, new in FILE_PATHS:
                text = text.replace(old, new)
            target.write_text(text, encoding="utf-8")
            touched.append(target)
            subprocess.run(["git", "add", "-N", str(target), str(folder / "__init__.py")], cwd=ROOT, check=True)
    follow_moves(touched)
    if plan:
        edit_texts()
    if touched:  # imports a module no longer uses go, the rest sorted; a fixture's parameter says noqa: F811
        ruff = [sys.executable, "-m", "ruff", "check", "-q", "--no-cache", *map(str, touched)]
        subprocess.run([*ruff, "--fix", "--select", "F401,I001"], cwd=ROOT, check=False)
        subprocess.run([*ruff, "--fix", "--fixable", "RUF100"], cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
        subprocess.run([*ruff, "--add-noqa", "--select", "F811"], cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
    after = collect("--setup-plan")  # every fixture each test asks for is found
    if after["errors"] or len(after["items"]) != len(before["items"]):
        print(
            f"tiers: {len(before['items'])} tests before, {len(after['items'])} after; failed to collect: "
            f"{after['errors']} (pytest --collect-only -q says why)",
            file=sys.stderr,
        )
        return ExitStatus.FAILED
    print(
        f"tiers: {len(after['items'])} tests, as before; moved {len(plan)} modules into "
        + ", ".join(f"tests/{t}/" for t in LIGHTEST_FIRST if (TESTS / t).is_dir())
    )
    return ExitStatus.OK


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except GpuTrainError as e:
        leave(e)
