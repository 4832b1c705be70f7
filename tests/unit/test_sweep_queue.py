"""The host's queue without launching: what it reads of a sweep's trials, and the idle clock counting a
queue with trials left as work (the launches themselves: tests/e2e/test_sweep.py)."""

from __future__ import annotations

import json
import os

from agent import lifecycle, sweep
from agent.store import write_settings
from gpu_train.sweeps import SweepDoc


def _sweep(root: str, name: str, trials: int, stopped: bool = False) -> SweepDoc:
    doc = SweepDoc(
        name=name,
        stamp="_20260101_000000",
        job={"runId": "x", "base": "x", "script": "train.py"},
        trials=tuple(
            {"index": i, "values": {"lr": i}, "args": ["--lr", str(i)], "base": f"{name}_t{i}", "node": i % 2} for i in range(trials)
        ),
        slots=([], []),
        node=0,
        stopped=stopped,
    )
    folder = os.path.join(root, "sweeps", name)
    os.makedirs(folder)
    with open(os.path.join(folder, "sweep.json"), "w") as f:
        json.dump(doc.to_json(), f)
    return doc


def _finished(root: str, run: str) -> None:
    os.makedirs(os.path.join(root, "runs", run, "job"))
    with open(os.path.join(root, "runs", run, "state.json"), "w") as f:
        json.dump({"id": run, "state": "succeeded", "created": 1.0, "started": 1.0, "ended": 2.0, "exitCode": 0}, f)


def test_a_nodes_trials_and_their_states(tmp_path):
    root = str(tmp_path)
    doc = sweep.mine(_sweep(root, "s", 5))
    assert [t["index"] for t in doc.trials] == [0, 2, 4]  # node 0's share
    _finished(root, "s_t2_20260101_000000")
    assert sweep.trial_states(root, doc) == ["pending", "succeeded", "pending"]
    assert sweep.pending(root) == 2
    row = sweep.cmd_sweep_status(root, None, None, "min")["trials"][1]
    assert (row["runId"], row["state"], row["node"], row["values"]) == ("s_t2_20260101_000000", "succeeded", 0, {"lr": 2})


def test_idle_stop_counts_trials_left_to_start_as_work(tmp_path):
    root = str(tmp_path)
    write_settings(root, {"idleStopMinutes": 30, "sshPort": 1, "poweroffCommand": ["false"]})
    _sweep(root, "busy", 3)  # node 0's share: t0, t2
    answer = lifecycle.cmd_tick(root)
    assert answer["why"].startswith("busy") and not answer["poweroff"]
    _finished(root, "busy_t0_20260101_000000")
    assert lifecycle.cmd_tick(root)["why"].startswith("busy")  # t2 is still to start
    _finished(root, "busy_t2_20260101_000000")
    assert lifecycle.cmd_tick(root)["why"].startswith("idle")  # t1 is node 1's to run
    _sweep(root, "halted", 2, stopped=True)
    assert lifecycle.cmd_tick(root)["why"].startswith("idle")  # a stopped sweep starts nothing more


def test_a_host_that_refuses_every_launch_burns_no_trial(tmp_path, monkeypatch):
    """No screen (a host's problem, before any run exists): the trials stay pending, `sweep status` says
    why, and every later try (a trial's end, boot, tick) tries the same trial again."""
    import agent.launch

    root = str(tmp_path)
    _sweep(root, "s", 4)
    os.makedirs(os.path.join(root, "sweeps", "s", "code"))
    monkeypatch.setattr(agent.launch.shutil, "which", lambda name: None)
    for _ in range(3):
        assert sweep.advance(root) == []
    assert sweep.trial_states(root, sweep.mine(sweep.read_sweep(root, "s"))) == ["pending", "pending"]
    said = sweep.cmd_sweep_status(root, "s", None, "min")
    assert "screen is not installed" in said["blocked"] and not os.path.isdir(os.path.join(root, "runs"))


def test_a_metric_no_trial_logged_is_answered_with_the_tags_they_did(tmp_path):
    """`sweep status --metric eval_loss` (as the HF Trainer prints it; its TensorBoard tag is eval/loss) showed a
    column of `-` and `sweep best` said "no trial has logged 'eval_loss' yet" of finished trials: the host now
    names the tags the trials logged, and the laptop the closest."""
    from remote.tasks.sweep import not_logged

    root = str(tmp_path)
    _sweep(root, "s", 3)
    _finished(root, "s_t0_20260101_000000")
    with open(os.path.join(root, "runs", "s_t0_20260101_000000", "job", "metrics.jsonl"), "w") as f:
        f.write('{"step": 1, "train/loss": 4.2, "eval/loss": 4.0}\n{"step": 2, "train/loss": 3.9, "eval/loss": 3.8}\n')
    said = sweep.cmd_sweep_status(root, "s", "eval_loss", "min")
    assert [r["last"] for r in said["trials"]] == [None, None] and said["tags"] == ["eval/loss", "train/loss"]
    assert not_logged(said, "eval_loss") == (
        "no trial of sweep s has logged 'eval_loss' (yet); they logged eval/loss, train/loss; did you mean --metric eval/loss?"
    )
    found = sweep.cmd_sweep_status(root, "s", "eval/loss", "min")
    assert found["trials"][0]["best"] == 3.8 and found["tags"] == []  # a metric logged: no list
