"""One test module's top-level statements split by tier, for scripts/dev/tiers.py: each test goes to its
tier's module, a helper with the tests of one other tier when only they use it, the rest stays (home)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

LIGHTEST_FIRST = ("unit", "slow", "e2e", "guest")  # tests/conftest.py TIERS, lightest first
IMPLICIT = {"LAB_ADDRESS": ("e2e", "guest")}  # read by the `lab` fixture from the test's module


# -- a module's top-level statements: what each binds and uses ---------------------------------
class Stmt:
    def __init__(self, node: ast.stmt, lines: list[str]):
        self.node = node
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        while start > 1 and lines[start - 2].strip().startswith("#"):  # comments right above it go with it
            start -= 1
        self.start, self.end = start, node.end_lineno or node.lineno  # 1-based, inclusive
        self.binds = bound_names(node)
        self.uses = used_names(node)
        self.is_import = isinstance(node, ast.Import | ast.ImportFrom)
        self.fixture = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
            "fixture" in ast.unparse(d) for d in node.decorator_list
        )
        self.autouse = self.fixture and any("autouse=True" in ast.unparse(d) for d in node.decorator_list)
        self.args = (
            {a.arg for a in node.args.args + node.args.kwonlyargs} if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else set()
        )

    def text(self, lines: list[str]) -> str:
        return "\n".join(lines[self.start - 1 : self.end])


def bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def used_names(node: ast.stmt) -> set[str]:
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):  # fixtures by parameter, and by usefixtures
        names |= {a.arg for a in node.args.args + node.args.kwonlyargs}
        for d in node.decorator_list:
            if "usefixtures" in ast.unparse(d):
                names |= {c.value for c in ast.walk(d) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return names


def import_of(stmt: Stmt, name: str) -> str:
    """The import statement that binds ``name`` alone, as ``stmt`` (an import) binds it."""
    node = stmt.node
    for alias in node.names:
        if (alias.asname or alias.name).split(".")[0] == name:
            one = ast.alias(alias.name, alias.asname)
            if isinstance(node, ast.Import):
                return ast.unparse(ast.Import([one]))
            return ast.unparse(ast.ImportFrom(node.module, [one], node.level))
    raise KeyError(name)


# -- the plan for one module --------------------------------------------------------------------
def split(path: Path, tiers: dict[str, str], imported_elsewhere: set[str]) -> dict[str, str]:
    """The new text of each tier's module, by tier; the lightest tier's is the module's own (home)."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    stmts = [Stmt(n, lines) for n in tree.body]
    present = sorted(set(tiers.values()), key=LIGHTEST_FIRST.index)
    home = present[0]
    where: dict[int, str] = {}  # statement index -> tier of the module it goes to
    for i, s in enumerate(stmts):
        name = next(iter(s.binds), None) if isinstance(s.node, ast.FunctionDef | ast.AsyncFunctionDef) else None
        if name in tiers:
            where[i] = tiers[name]
    first_code = next(
        (
            i
            for i, s in enumerate(stmts)
            if not s.is_import and not (isinstance(s.node, ast.Expr) and isinstance(s.node.value, ast.Constant))
        ),
        len(stmts),
    )
    defs = {name: i for i, s in enumerate(stmts) if not s.is_import for name in s.binds}
    # A helper moves with the tests of one other tier when only they (and helpers moving with them) use it.
    changed = True
    while changed:
        changed = False
        for i, s in enumerate(stmts):
            if i in where or s.is_import or not s.binds or s.autouse or "pytestmark" in s.binds:
                continue
            if s.binds & imported_elsewhere or not isinstance(
                s.node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Assign | ast.AnnAssign
            ):
                continue
            users = {j for j, t in enumerate(stmts) if j != i and t.uses & s.binds}
            implicit = {j for j, t in where.items() if t in IMPLICIT.get(next(iter(s.binds)), ())}
            users |= implicit
            if users and all(j in where for j in users):
                targets = {where[j] for j in users}
                if len(targets) == 1 and (target := targets.pop()) != home:
                    where[i] = target
                    changed = True
    out: dict[str, str] = {}
    home_keep = [i for i in range(len(stmts)) if where.get(i, home) == home]
    for tier in present[1:]:
        moved = [i for i, t in where.items() if t == tier]
        needed: set[str] = set()
        for i in moved:
            needed |= stmts[i].uses
        for s in stmts:  # pytestmark applies to every test of the module
            if "pytestmark" in s.binds:
                needed |= s.uses
        imports, late, from_home, fixtures = [], [], set(), set()
        pending = set(needed)
        while pending:
            name = pending.pop()
            if name in defs and defs[name] not in moved:
                s = stmts[defs[name]]
                if "pytestmark" in s.binds:
                    continue
                (fixtures if s.fixture else from_home).add(name)
                if s.fixture:  # the fixtures it asks for must be visible from the new module too
                    pending |= {a for a in s.args if a in defs and a not in fixtures} - {name}
            else:
                at = next((i for i, s in enumerate(stmts) if s.is_import and name in s.binds), None)
                if at is not None and at > first_code:  # imported after a statement it needs (sys.path.insert)
                    late.append((at, import_of(stmts[at], name)))
                elif at is not None and any(name in stmts[i].args for i in moved):  # a fixture: a parameter's name
                    imports.append(import_of(stmts[at], name) + "  # noqa: F401 (a fixture)")
                elif at is not None:
                    imports.append(import_of(stmts[at], name))
        fixtures |= {n for s in stmts if s.autouse for n in s.binds}
        mod = f"tests.{home}.{path.stem}"
        head = [
            f'"""The {tier} tier of tests/{home}/{path.name} (the same subject; its helpers are there)."""',
            "",
            "from __future__ import annotations",
            "",
        ]
        head += sorted(set(imports) - {"from __future__ import annotations"})
        if from_home:
            head.append(f"from {mod} import {', '.join(sorted(from_home))}")
        if fixtures:
            head.append(f"from {mod} import {', '.join(sorted(fixtures))}  # noqa: F401 (fixtures)")
        if late:  # what the module did before them (sys.path.insert), then they
            head += [""] + [stmts[i].text(lines) for i in range(first_code, max(late)[0]) if isinstance(stmts[i].node, ast.Expr)]
            head += [text for _, text in sorted(late)]
        body = [stmts[i].text(lines) for i, s in enumerate(stmts) if "pytestmark" in s.binds]
        body += [stmts[i].text(lines) for i in sorted(moved)]
        out[tier] = "\n".join(head) + "\n\n\n" + "\n\n\n".join(body) + "\n"
    # The home module: the original, less what moved (line ranges), blank runs squeezed.
    drop = set()
    for i, s in enumerate(stmts):
        if i not in home_keep:
            drop |= set(range(s.start, s.end + 1))
    kept = [line for n, line in enumerate(lines, 1) if n not in drop]
    text = re.sub(r"\n{4,}", "\n\n\n", "\n".join(kept).rstrip() + "\n")
    out[home] = text
    return out
