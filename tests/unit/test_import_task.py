"""`fab import` and `gpu-train import` as a user runs them, in processes of their own: the stack file
written once and valid for `scripts/plan`, the JSON report, the gcloud command after `--`, bad input
refused with a message. The translation itself is tests/unit/test_import.py's tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gpu_train.importing import gcloud_flags
from gpu_train.stack import stackfile
from infra.ops import plan
from tests.conftest import ROOT
from tests.unit.test_import import CLUSTER_POOLS, GUIDE_CE, GUIDE_GCLOUD, KEY


def fab(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabric", "-r", str(ROOT), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_import_task_writes_a_valid_stack_once(tmp_path) -> None:
    job = tmp_path / "config.yaml"
    job.write_text(GUIDE_CE + "  region: us-central1\n  pythonModule: trainer.task\n")
    stacks = tmp_path / "stacks"
    args = ("import", str(job), "--stack", "aip", "--stacks-dir", str(stacks), "--project", "proj-1", "--ssh-from", "203.0.113.7/32")
    out = fab(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "The stack is valid" in out.stdout and "gpu-train train --stack aip --command 'python -m trainer.task'" in out.stdout
    assert "gpu-train up --stack aip;" in out.stderr, out.stderr  # the stack it wrote, not a placeholder
    written = stackfile.read_stack_file(stacks / "Pulumi.aip.yaml")
    assert written["gpu-train:pools"] == CLUSTER_POOLS and written["gcp:project"] == "proj-1"
    assert plans_file(stacks / "Pulumi.aip.yaml") == 0
    before = (stacks / "Pulumi.aip.yaml").read_bytes()
    again = fab(*args, cwd=tmp_path)  # never over an existing stack without --force
    assert again.returncode == 2 and "exists" in again.stderr
    assert (stacks / "Pulumi.aip.yaml").read_bytes() == before


def test_the_import_task_from_gcloud_and_as_json(tmp_path) -> None:
    out = fab("import", "gcloud", "--stack", "g", "--stacks-dir", str(tmp_path), "--json", "--gcloud", GUIDE_GCLOUD, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["settings"]["gpu-train:pools"] == CLUSTER_POOLS
    assert any("sshSourceRanges" in p and "required" in p for p in doc["problems"])  # said, and written anyway
    assert {r["status"] for r in doc["report"]} >= {"exact", "not mapped"}
    bad = fab("import", str(tmp_path / "missing.yaml"), "--stack", "m", "--stacks-dir", str(tmp_path), cwd=tmp_path)
    assert bad.returncode == 2 and "cannot read" in bad.stderr and "Traceback" not in bad.stderr
    tpu = tmp_path / "tpu.yaml"
    tpu.write_text("trainingInput: {scaleTier: BASIC_TPU}")
    bad = fab("import", str(tpu), "--stacks-dir", str(tmp_path), cwd=tmp_path)
    assert bad.returncode == 2 and "Cloud TPU" in bad.stderr and not (tmp_path / "Pulumi.tpu.yaml").exists()


def plans_file(path) -> int:
    raw = {**stackfile.read_stack_file(path), "gpu-train:sshPublicKey": KEY}
    return plan.plan(raw, "aip")[1]


def test_gpu_train_import_takes_gcloud_after_the_double_dash(tmp_path) -> None:
    """As pasted: `gpu-train import gcloud -- gcloud ai-platform ... -- USER ARGS`, quoting kept."""
    argv = [
        "gpu-train",
        "import",
        "gcloud",
        "--stack",
        "g",
        "--stacks-dir",
        str(tmp_path),
        "--json",
        "--",
        *gcloud_flags.split_gcloud_command(GUIDE_GCLOUD.replace("--lr 0.1", "--note 'two words'")),
    ]
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.argv = {argv!r}\nfrom remote.cli import main; main()"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["train"][-1] == "python -m trainer.task --epochs 10 --note 'two words' --job-dir \"$JOB_DIR\""
    assert (tmp_path / "Pulumi.g.yaml").is_file()
