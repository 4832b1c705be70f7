"""A run's curves come home in one agent call (`scalars`, the laptop's ``fetch_scalars``), read on the host
from the event files real writers made: PyTorch's SummaryWriter in a job, and an unchanged Lightning project
(tests/real_projects/); TensorBoard's own reader of the same files is the oracle. Loopback 127.0.41.x."""

from __future__ import annotations

import glob
import os
import textwrap

import pytest

from gpu_train.environment import Environment
from remote.tasks.scalars import fetch_scalars
from remote.tasks.session import Session
from tests.conftest import Lab
from tests.e2e.test_real_projects import write_project
from tests.unit.test_tfevents import _oracle

LAB_ADDRESS = "127.0.41.1"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SUMMARY_WRITER_JOB = textwrap.dedent(
    """
    import json, os
    import torch
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter()  # ./runs/DATE_HOST, the default most scripts keep
    with open(os.path.join(os.environ["JOB_DIR"], "metrics.jsonl"), "w") as f:
        for step in range(400):
            loss = 5.0 / (step + 1) + (0.5 if step == 123 else 0.0)
            w.add_scalar("train/loss", loss, step)
            w.add_scalar("eval/acc", step / 400, step, new_style=True)
            if step % 50 == 0:
                w.add_histogram("weights", torch.tensor([0.1 * step, 0.2]), step)
            f.write(json.dumps({"step": step, "loss": loss}) + "\\n")
    w.close()
    print("wrote", flush=True)
    """
)


def _host_files(lab: Lab, run: str, pattern: str) -> list[str]:
    return sorted(glob.glob(str(lab.remote / "runs" / run / pattern), recursive=True))


def test_summarywriter_curves_in_one_call(lab: Lab) -> None:
    (lab.cwd / "train.py").write_text(SUMMARY_WRITER_JOB)
    run = lab.train("--script", "train.py")
    info = lab.wait(run, timeout=180)
    assert info["state"] == "succeeded", lab.log(run)[-3000:]
    session = Session(Environment.from_os(lab.env), "lab")
    doc = fetch_scalars(session, [run], points=50)
    session.close()
    (got,) = doc.runs
    series = {(s["kind"], s["tag"]): s for s in got["series"]}
    assert sorted(series) == [("jsonl", "loss"), ("tfevents", "eval/acc"), ("tfevents", "train/loss")]
    (event_file,) = _host_files(lab, run, "code/runs/**/events.out.tfevents.*")
    theirs = _oracle(event_file)
    loss = series[("tfevents", "train/loss")]
    assert loss["source"] == os.path.relpath(os.path.dirname(event_file), lab.remote / "runs" / run)
    assert loss["count"] == 400 and len(loss["points"]) == 50 and loss["points"][0][0] == 0 and loss["points"][-1][0] == 399
    expected = dict(theirs["train/loss"])
    assert all(v == pytest.approx(expected[s]) for s, v in loss["points"])
    assert loss["min"] == [399, pytest.approx(min(v for _, v in theirs["train/loss"]))]
    assert loss["max"] == [0, pytest.approx(5.0)] and loss["last"] == [399, pytest.approx(expected[399])]
    acc = series[("tfevents", "eval/acc")]
    assert acc["last"] == [399, pytest.approx(theirs["eval/acc"][-1][1])] and acc["count"] == 400
    jsonl = series[("jsonl", "loss")]
    assert jsonl["source"] == "job/metrics.jsonl" and jsonl["points"][-1] == [399, pytest.approx(expected[399])]


def test_lightning_project_curves_as_tensorboard_reads_them(lab: Lab) -> None:
    """An unchanged Lightning project: its TensorBoardLogger's lightning_logs/version_0 in its working directory."""
    write_project(lab, "lightning_trainer")
    run = lab.train("--script", "train.py", "--args", "--max_steps 60 --every_n_steps 30")
    info = lab.wait(run, timeout=240)
    assert info["state"] == "succeeded", lab.log(run)[-3000:]
    session = Session(Environment.from_os(lab.env), "lab")
    doc = fetch_scalars(session, [run], tags=["train_loss"])
    session.close()
    (event_file,) = _host_files(lab, run, "code/lightning_logs/version_0/events.out.tfevents.*")
    (loss,) = doc.runs[0]["series"]
    assert loss["source"] == "code/lightning_logs/version_0" and loss["tag"] == "train_loss"
    theirs = _oracle(event_file)["train_loss"]
    assert len(theirs) == 6  # every 10 of 60 steps
    assert [s for s, _ in loss["points"]] == [s for s, _ in theirs]
    assert [v for _, v in loss["points"]] == pytest.approx([v for _, v in theirs])
