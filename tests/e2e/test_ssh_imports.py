"""A task on an SSH stack loads no Compute Engine module: not the GCP rules (gpu_train/gcp/) nor the GPU catalog (gpu_train/catalog/),
not the Pulumi program and scripts (infra/), not Google's or Pulumi's libraries. Each is CPU every
command on a plain SSH host would spend for nothing (issue 36: a `fetch` imported 11 Compute Engine
rule modules and the Pulumi scripts' probes).

The modules are read from the real command's own `python -X importtime` report, end to end against
the lab's real sshd: resolving the stack, the login, the shared connection, the agent call, the sync.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FAB, ROOT, Lab

# What an SSH stack's tasks have no use for (a module is named by its full dotted name).
GCP_ONLY = re.compile(r"(gpu_train\.gcp|gpu_train\.catalog|infra|pulumi|pulumi_gcp|google\.cloud|googleapiclient|grpc)(\..*)?")
IMPORTED = re.compile(r"import time:\s+\d+ \|\s+\d+ \|( *)(\S+)$")


def imported(lab: Lab, *args: str) -> set[str]:
    """Every module the real `fab ARGS` imported (from Python's -X importtime report on its stderr)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", FAB, "--search-root", str(ROOT), *args],
        env=lab.env,
        cwd=lab.cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return {m.group(2) for line in out.stderr.splitlines() if (m := IMPORTED.match(line))}


@pytest.mark.e2e
def test_tasks_on_an_ssh_stack_load_no_compute_engine_module(lab: Lab, plain: str, tmp_path: Path) -> None:
    run = lab.train("--dir", plain, "--command", "echo done > $JOB_DIR/out.txt", "--name", "imports")
    lab.wait(run)
    seen = {
        "train": imported(lab, "train", "--dir", plain, "--command", "true", "--name", "again"),
        "status": imported(lab, "status"),
        "logs": imported(lab, "logs", "--run", run),
        "fetch": imported(lab, "fetch", "--run", run, "--dest", str(tmp_path / "got")),
    }
    assert (tmp_path / "got").is_dir()  # the fetch did fetch
    assert all("remote.tasks.fetch" in mods and "gpu_train.stack.config" in mods for mods in seen.values())  # the report was read
    unused = {task: sorted(m for m in mods if GCP_ONLY.fullmatch(m)) for task, mods in seen.items()}
    assert not any(unused.values()), "\n".join(f"{task}: {', '.join(mods)}" for task, mods in unused.items())
