"""The one seam to the Pulumi CLI: run it in the project, and read what a stack holds now.

Tests put a stand-in `pulumi` (tests/stand_in/pulumi) first on PATH; nothing else is faked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
Runner = Callable[..., tuple[int, str]]


def run(args: list[str], echo: bool = True) -> tuple[int, str]:
    """Run `pulumi ARGS` in the project, showing its output as it comes (when ``echo``); (exit code, output)."""
    proc = subprocess.Popen(["pulumi", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    assert proc.stdout is not None  # stdout=PIPE
    for line in proc.stdout:
        lines.append(line)
        if echo:
            sys.stdout.write(line)
    return proc.wait(), "".join(lines)


@dataclass(frozen=True)
class Resource:
    """One resource of a stack's state (`pulumi stack export`)."""

    urn: str
    typ: str
    inputs: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    protect: bool = False
    custom: bool = True
    id: str = ""  # the provider's id: a replaced resource keeps its URN and gets a new id

    @property
    def name(self) -> str:
        """The logical name: the URN's last part (`urn:pulumi:STACK::PROJECT::TYPES::NAME`)."""
        return self.urn.split("::", 3)[-1]


def parse_export(text: str) -> list[Resource]:
    """The resources of a `pulumi stack export` document (the stack itself and providers included)."""
    doc = json.loads(text)
    out = []
    for r in (doc.get("deployment") or {}).get("resources") or []:
        out.append(
            Resource(
                r["urn"],
                r["type"],
                r.get("inputs") or {},
                r.get("outputs") or {},
                bool(r.get("protect")),
                bool(r.get("custom", True)),
                str(r.get("id") or ""),
            )
        )
    return out


def stack_resources(stack: str, pulumi: Runner = run) -> list[Resource] | None:
    """What the stack holds now; None when the stack does not exist (or cannot be read)."""
    code, out = pulumi(["stack", "export", "--stack", stack], echo=False)
    if code != 0:
        return None
    start = out.find("{")  # the CLI may print a warning line before the document
    try:
        return parse_export(out[start:]) if start >= 0 else []
    except (json.JSONDecodeError, KeyError, TypeError):
        return None


def of_type(resources: list[Resource], suffix: str) -> list[Resource]:
    return [r for r in resources if r.typ.endswith(suffix)]


def has_vm(resources: list[Resource] | None) -> bool:
    """Does the stack hold a VM (an instance) now?"""
    return bool(resources) and bool(of_type(resources or [], "compute/instance:Instance"))


def release_data_disks(stack: str, pulumi: Runner = run) -> list[str]:
    """Lift `protect` from the stack's data disks, so that `pulumi destroy` may delete them: only for
    `fab down`, after every run was fetched home. Returns the disks released; raises RuntimeError
    (nothing destroyed yet) when one cannot be."""
    resources = stack_resources(stack, pulumi)
    if resources is None:
        raise RuntimeError(f"`pulumi stack export --stack {stack}` failed: cannot tell which data disks to release")
    released = []
    for disk in of_type(resources, "compute/disk:Disk"):
        if not disk.protect:
            continue
        code, out = pulumi(["state", "unprotect", disk.urn, "--yes", "--stack", stack], echo=False)
        if code:
            raise RuntimeError(f"cannot release the data disk {disk.name}: {out.strip()}")
        released.append(disk.name)
    return released
