"""docs/architecture.md is the map a newcomer reads first: it must name every module where it is.

A module added, split or renamed without its row updated fails here, so the map cannot drift from the
tree. The house rules the map relies on are checked too: rooms of a size a newcomer can hold (about
400 lines), no import cycles between the packages, no module-level name shadowing a module, and a
core (gpu_train/) that is handed its data rather than reading it.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tests.conftest import parse_source

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "gpu_train",
    "gpu_train/catalog",
    "gpu_train/stack",
    "gpu_train/gcp",
    "gpu_train/views",
    "gpu_train/importing",
    "infra",
    "infra/ops",
    "remote",
    "remote/ssh",
    "remote/transfer",
    "remote/transfer/fetch",
    "remote/tasks",
    "remote/dashboard",
    "agent",
)
MAP = ROOT / "docs" / "architecture.md"
MAX_LINES = 400


def layout() -> str:
    text = MAP.read_text(encoding="utf-8")
    start = text.index("\n## The rooms\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def row(directory: str) -> str:
    """The table row whose first cell names ``directory/``."""
    for line in layout().splitlines():
        cells = line.split("|")
        if len(cells) > 2 and f"`{directory}/`" in cells[1]:
            return cells[2]
    raise AssertionError(f"docs/architecture.md has no row for {directory}/")


def modules(directory: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / directory).glob("*.py") if p.stem not in ("__init__", "__main__"))


@pytest.mark.parametrize("directory", PACKAGES)
def test_every_module_is_on_the_map(directory: str) -> None:
    text = row(directory)
    named = set(re.findall(r"`([A-Za-z_][\w]*)`", text))
    missing = [m for m in modules(directory) if m not in named]
    assert not missing, f"docs/architecture.md, row {directory}/: add {', '.join(missing)} (one phrase each: what it is)"


def test_where_a_newcomer_starts_reading_exists() -> None:
    text = layout()
    start = text.index("A newcomer starts reading")
    paths = re.findall(r"`([\w/]+\.py)`", text[start:])
    assert paths, "the map says where a newcomer starts reading, naming files"
    for path in paths:
        assert (ROOT / path).is_file(), f"docs/architecture.md: {path} (where a newcomer starts reading) does not exist"


def source_files() -> list[Path]:
    dirs = ("gpu_train", "agent", "infra", "remote", "scripts", "bench", "tests")
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py") if ".venv" not in p.parts)


def test_no_room_is_too_big_for_a_newcomer() -> None:
    big = {str(p.relative_to(ROOT)): n for p in source_files() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not big, f"split these by concept (a module per concept, not halves): {big}"


def test_no_import_cycles() -> None:
    """Between the modules of gpu_train, infra and remote, counting imports inside functions too."""
    names = {}
    for p in source_files():
        rel = p.relative_to(ROOT)
        if rel.parts[0] in ("gpu_train", "agent", "infra", "remote"):
            name = ".".join(rel.with_suffix("").parts)
            names[name.removesuffix(".__init__")] = p
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        deps = set()
        for node in ast.walk(parse_source(path)):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names else node.module for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        graph[name] = {d for d in deps if d in names and d != name}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(name) :], name]))
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_no_module_level_name_shadows_a_module() -> None:
    """A top-level def, class or assignment must not reuse the name of a module: not of one the
    module imports, and in a package's __init__ not of the package's own modules (``remote.tasks.fetch``
    would then be a function or a module depending on import order)."""
    found = []
    for path in source_files():
        tree = parse_source(path)
        imported = {(a.asname or a.name).split(".")[0] for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}
        siblings = {p.stem for p in path.parent.glob("*.py")} if path.name == "__init__.py" else set()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            else:
                continue
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n in imported | siblings]
    assert not found, f"rename these (they shadow a module): {found}"


LOADERS = {"load_catalog", "load_rules", "load_tables", "read_startup_template"}  # each reads one of gpu_train/data/


def test_the_core_is_handed_its_data() -> None:
    """The decisions in gpu_train/ never read the data files: the entry points, tasks and scripts load
    them and pass them in, so every decision is a plain function of its arguments."""
    calls = []
    for path in sorted((ROOT / "gpu_train").rglob("*.py")):
        tree = parse_source(path)
        main = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        skip = {id(n) for block in main for n in ast.walk(block)}  # `python -m gpu_train.X` is an entry point
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and id(node) not in skip:
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in LOADERS:
                    calls.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}()")
    assert not calls, f"take the data as an argument instead: {calls}"


# Which rooms may import which (a room: a package folder; its modules' imports, inside functions too).
# Bottom up: contract, catalog <- stack <- gcp <- jobs/views/importing; the agent takes only the core's modules
# its zipapp carries (contract, answers, codec, atomic, recovery, fetchwire, checksum, sweeps, ownership, retry);
# the laptop's side: ssh <- transfer <- tasks; the core never imports remote or infra.
ALLOWED = {
    "gpu_train.codec": set(),  # stdlib only: the zipapp carries it with the contract
    "gpu_train.contract": {"gpu_train.codec", "gpu_train.containerspec", "gpu_train.bucketdoc"},
    "gpu_train.bucketdoc": set(),  # stdlib only: the zipapp carries it with the contract
    "gpu_train.containerspec": {"gpu_train.codec"},  # stdlib only: the zipapp carries it with the contract
    "gpu_train.answers": {"gpu_train.contract", "gpu_train.bucketdoc"},  # the agent's answers, beside the contract (stdlib only, carried)
    "gpu_train.recovery": set(),  # stdlib only: the zipapp and the Cloud Run function carry it too
    "gpu_train.fetchwire": set(),  # these two: stdlib only, the zipapp carries them (agent/bundle.py CARRIED)
    "gpu_train.checksum": set(),
    "gpu_train.sweeps": {"gpu_train.codec"},  # a sweep's plan: the laptop's and the queue's (carried)
    "gpu_train.errors": set(),
    "gpu_train.atomic": set(),
    "gpu_train.retry": set(),  # the one way to wait: stdlib only, the zipapp carries it (a log's follow)
    "gpu_train.environment": {"gpu_train.errors", "gpu_train.stack", "gpu_train.identity"},  # the laptop's world
    "gpu_train.ownership": set(),  # whose run: stdlib only, the zipapp carries it with the contract
    "gpu_train.identity": {
        "gpu_train.ownership",
        "gpu_train.contract",
        "gpu_train.errors",
        "gpu_train.atomic",
    },  # a project's id, made on the laptop
    "gpu_train.launcher": {"remote.cli", "remote.ssh.early"},  # the entry point: the command, and status or logs asked early
    "gpu_train.catalog": {"gpu_train.errors", "gpu_train.atomic"},  # the facts, below everything that judges by them
    "gpu_train.stack": {"gpu_train.contract", "gpu_train.containerspec", "gpu_train.errors", "gpu_train.atomic", "gpu_train.catalog"},
    "gpu_train.gcp": {"gpu_train.contract", "gpu_train.errors", "gpu_train.catalog", "gpu_train.stack", "gpu_train.recovery"},
    "gpu_train.jobargs": {"gpu_train.contract", "gpu_train.containerspec", "gpu_train.errors"},  # train's options checked: --env, --image
    "gpu_train.pooljobs": {"gpu_train.contract", "gpu_train.containerspec", "gpu_train.jobargs"},  # train --pools: each pool's own job
    "gpu_train.jobs": {
        "gpu_train.contract",
        "gpu_train.errors",
        "gpu_train.catalog",
        "gpu_train.stack",
        "gpu_train.gcp",
        "gpu_train.jobargs",
    },
    "gpu_train.views": {
        "gpu_train.contract",
        "gpu_train.answers",
        "gpu_train.errors",
        "gpu_train.catalog",
        "gpu_train.stack",
        "gpu_train.gcp",
        "gpu_train.recovery",
    },
    "gpu_train.importing": {"gpu_train.contract", "gpu_train.errors", "gpu_train.catalog", "gpu_train.stack", "gpu_train.gcp"},
    # what the zipapp carries of the core (agent/bundle.py CARRIED)
    "agent": {
        "gpu_train.answers",
        "gpu_train.atomic",
        "gpu_train.bucketdoc",
        "gpu_train.codec",
        "gpu_train.contract",
        "gpu_train.containerspec",
        "gpu_train.recovery",
        "gpu_train.fetchwire",
        "gpu_train.checksum",
        "gpu_train.sweeps",
        "gpu_train.ownership",
        "gpu_train.retry",
    },
    # the agent's packer runs on the laptop, beside what it packs (not in the zipapp): it keeps the zipapp on disk
    "agent.bundle": {"gpu_train.atomic", "gpu_train.contract", "agent.bootstrap"},  # (its version's name: the bootstrap's rule)
    "infra": {"gpu_train", "agent.bundle"},  # the startup script carries the agent's zipapp
    "infra.__main__": {"gpu_train", "infra"},  # `pulumi up`'s entry point: builds Google's lookups (infra.ops)
    "infra.ops": {"gpu_train", "infra"},
    "remote.errors": {"gpu_train"},
    "remote.ssh": {"gpu_train", "remote.errors", "agent.bundle"},
    "remote.transfer": {"gpu_train", "remote.errors", "remote.ssh", "agent.bundle"},
    "remote.tasks": {"gpu_train", "remote.errors", "remote.ssh", "remote.transfer", "agent.bundle", "infra.ops", "remote.dashboard"},
    # the dashboard asks as the tasks do (their sessions, gather, the log stream); `dashboard` and `report` start it
    "remote.dashboard": {"gpu_train", "remote.errors", "remote.ssh", "remote.tasks", "infra.ops"},
    "remote.cli": {"gpu_train", "remote.errors", "remote.tasks", "remote"},
    "remote.fab": {"remote.cli", "remote.errors"},  # the clone's `fab`: the same executor, on Fabric's
    "remote.loopback": set(),
    "remote.setup": {"gpu_train", "infra.ops", "remote.transfer"},  # scripts/setup: this machine's tools, SSH's and Google's
}
# Arrows that still point the wrong way, each a debt with its reason (pay it, then delete the line).
DEBTS: dict[tuple[str, str], str] = {}


def room(module: str) -> str:
    """The room a module lives in: its package folder, or the module itself at a top level."""
    for r in sorted(ALLOWED, key=len, reverse=True):
        if module == r or module.startswith(r + "."):
            return r
    return module


@functools.cache
def arrows() -> frozenset[tuple[str, str]]:
    """Every import between our packages, as (importer, imported): read once a process (two tests ask)."""
    found = set()
    for p in source_files():
        rel = p.relative_to(ROOT)
        if rel.parts[0] not in ("gpu_train", "agent", "infra", "remote"):
            continue
        me = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(parse_source(p)):
            mods = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            found |= {(me, m) for m in mods if m.split(".")[0] in ("gpu_train", "agent", "infra", "remote")}
    return frozenset(found)


def test_imports_point_down_the_house() -> None:
    wrong = []
    for me, dep in sorted(arrows()):
        a, b = room(me), room(dep)
        if a == b or any(x == ok or x.startswith(ok + ".") for ok in ALLOWED.get(a, set()) for x in (b, dep)):
            continue
        if any((me == x or me.startswith(x + ".")) and (dep == y or dep.startswith(y + ".")) for x, y in DEBTS):
            continue
        wrong.append(f"{me} -> {dep}")
    assert not wrong, f"these imports point the wrong way (see docs/architecture.md): {wrong}"


def test_every_debt_is_still_owed() -> None:
    """A debt paid is deleted from DEBTS, so the list never hides a new arrow behind an old excuse."""
    found = arrows()
    paid = [
        f"{x} -> {y}"
        for x, y in DEBTS
        if not any((me == x or me.startswith(x + ".")) and (dep == y or dep.startswith(y + ".")) for me, dep in found)
    ]
    assert not paid, f"delete these from DEBTS: {paid}"


BEGIN, END = "<!-- arrows: begin (generated from tests/unit/test_layout.py) -->", "<!-- arrows: end -->"


def arrows_table() -> str:
    """ALLOWED and DEBTS as the markdown table docs/architecture.md shows (between BEGIN and END)."""
    lines = ["| room | may import (besides itself and the standard library) |", "|---|---|"]
    for name in sorted(ALLOWED):
        lines.append(f"| `{name}` | {', '.join(f'`{d}`' for d in sorted(ALLOWED[name])) or 'nothing of ours'} |")
    if not DEBTS:
        return "\n".join([*lines, "", "No arrow points the wrong way today: the list of debts is empty."])
    lines += ["", "| debt: an arrow the wrong way | why it is still there |", "|---|---|"]
    lines += [f"| `{a}` -> `{b}` | {why} |" for (a, b), why in sorted(DEBTS.items())]
    return "\n".join(lines)


def test_the_maps_arrows_are_the_rule() -> None:
    """The arrows docs/architecture.md states are the ones this test enforces: a rule changed here and
    not there (or the other way) fails, so the map's claims about imports stay true."""
    text = MAP.read_text(encoding="utf-8")
    shown = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()
    assert shown == arrows_table(), "docs/architecture.md's arrows differ from ALLOWED/DEBTS: run `python -m tests.unit.test_layout`"


if __name__ == "__main__":  # rewrite the map's table from ALLOWED and DEBTS
    text = MAP.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN)
    MAP.write_text(f"{head}{BEGIN}\n{arrows_table()}\n{END}{rest.split(END, 1)[1]}", encoding="utf-8")
