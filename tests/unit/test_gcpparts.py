"""pulumi-gcp's resources load one module each (infra/gcpparts.py): the program declares what it did, and
`scripts/plan` no longer imports every resource of the namespaces it touches (288 modules for compute)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, parse_source

INFRA = ROOT / "infra"


def used_by_the_program() -> set[tuple[str, str]]:
    """Every ``gcp.NAMESPACE.Name`` the Pulumi program's modules spell."""
    used = set()
    for path in sorted(INFRA.rglob("*.py")):
        for node in ast.walk(parse_source(path)):
            inner = node.value if isinstance(node, ast.Attribute) else None
            if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and inner.value.id == "gcp":
                used.add((inner.attr, node.attr))
    return used


def test_every_resource_the_program_names_has_its_module_listed() -> None:
    from infra.gcpparts import PARTS

    used = used_by_the_program()
    assert ("compute", "Instance") in used and ("cloudfunctionsv2", "Function") in used
    assert sorted(u for u in used if u[1] not in PARTS.get(u[0], {})) == []
    for namespace, parts in PARTS.items():  # each listed module defines its name
        folder = Path(__import__("pulumi_gcp").__file__).parent / namespace
        for name, module in parts.items():
            assert (folder / f"{module}.py").is_file(), (namespace, name, module)


LOADED = r"""
import contextlib, io, sys
from infra.ops import plan
with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
    try:
        plan.main(["--stack", "t4-spot"])
    except SystemExit:
        pass
assert "would create" in out.getvalue(), out.getvalue()
loaded = [m for m, mod in list(sys.modules.items()) if m.startswith("pulumi_gcp.") and type(mod).__name__ != "_LazyModule"]
print(sum(1 for m in loaded if m.startswith("pulumi_gcp.compute.")), len(loaded))  # (pulumi-gcp's unused lazy namespaces left out)
"""


def test_a_plan_loads_the_resources_it_declares_not_every_one_of_their_namespaces() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", LOADED], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    compute, every = map(int, out.stdout.split())
    assert compute <= 12 and every <= 60, (compute, every)  # before: 288 of compute, 470 in all


def test_each_listed_name_is_its_resource_or_function_even_after_its_module_was_imported() -> None:
    """Importing pulumi_gcp.compute.get_image binds that module on the namespace under the function's name
    (pulumi-gcp's own __init__ rebinds it with `from .get_image import *`): gcp.compute.get_image stays callable."""
    import importlib
    import types

    from infra.gcpparts import PARTS, gcp

    importlib.import_module("pulumi_gcp.compute.get_instance")
    for namespace, parts in PARTS.items():
        for name in parts:
            assert not isinstance(getattr(getattr(gcp, namespace), name), types.ModuleType), (namespace, name)
    assert callable(gcp.compute.get_instance) and callable(gcp.compute.get_image)
