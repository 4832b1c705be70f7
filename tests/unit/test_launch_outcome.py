"""`launch-outcome` (agent/outcome.py): whether a launch whose answer the laptop lost started its run, and
final. The agent as the laptop runs it (`python -m agent`), on a REMOTE_ROOT of the test's (no sshd); the
e2e tier cuts a real link at that moment (tests/e2e/test_lost_launch.py). A sweep's start is asked about
the same way (`launch-outcome --sweep`, agent/sweep.py; tests/e2e/test_lost_sweep.py). And which ends of
a call's channel the laptop takes for a lost answer (remote/ssh/agentcall.py), on a real process's."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_train.stack.sshhost import SshHost
from remote.errors import RemoteError
from remote.ssh import agentcall
from remote.ssh.mux import MuxConnection
from tests.conftest import ROOT
from tests.unit.test_jobs_sync_target import lab_target

RUN = "lost_20250101_000000"
SWEEP, STAMP = "lostsweep", "_20250101_000000"  # a sweep's name, and the stamp its start chose
STAGED = SWEEP + STAMP  # its code's name in the staging area: what its start is asked about by
# The agent as a host keeps it (in place of the zipapp, which Python runs as this file): what the wrapper runs.
INSTALLED = "import sys\nsys.path.insert(0, {root!r})\nfrom agent.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def agent(root: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "agent", "--root", str(root), *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout.strip().splitlines()[-1])


def waiting_launch(root: Path) -> subprocess.Popen[bytes]:
    """The agent's `launch --await-go` as the laptop starts it, the code staged: it said "ready" and waits for "go"."""
    (root / "staging" / RUN).mkdir(parents=True)
    (root / "staging" / RUN / "train.py").write_text("print('hi')\n")
    (root / "bin").mkdir()  # the agent where the host keeps it (the zipapp's place): the run's wrapper runs it
    (root / "bin" / "gpu-train-agent").write_text(INSTALLED.format(root=str(ROOT)))
    spec = {"runId": RUN, "base": "lost", "command": "true", "python": sys.executable}
    launch = subprocess.Popen(
        [sys.executable, "-m", "agent", "--root", str(root), "launch", "-", "--await-go"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert launch.stdin is not None and launch.stdout is not None
    launch.stdin.write(base64.b64encode(json.dumps(spec).encode()) + b"\n")
    launch.stdin.flush()
    assert json.loads(launch.stdout.readline())["ready"]
    return launch


def told(launch: subprocess.Popen[bytes], word: bytes) -> dict[str, Any]:
    """The launch's last answer once the laptop's ``word`` reached it."""
    out, _ = launch.communicate(word, timeout=60)
    return json.loads(out.decode().strip().splitlines()[-1])


def test_a_launch_asked_about_before_it_made_its_run_never_makes_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    launch = waiting_launch(root)  # the laptop's "go" is on its way, or lost
    assert agent(root, "launch-outcome", "--run", RUN) == {
        "runId": RUN,
        "launched": None,
        "reason": "the launch had not started it, and now will not",
    }
    late = told(launch, b"go\n")  # the "go" arrives after all: too late, the laptop was told it did not start
    assert "was not started: the laptop lost its connection during the launch" in late["error"]
    assert not (root / "runs" / RUN).exists() and not (root / "staging" / RUN).exists()


def test_a_launch_that_started_its_run_is_answered_as_the_launch_itself_was(tmp_path: Path) -> None:
    root = tmp_path / "root"
    launched = told(waiting_launch(root), b"go\n")
    assert launched["runId"] == RUN and launched["python"] == sys.executable
    assert agent(root, "launch-outcome", "--run", RUN) == {"runId": RUN, "launched": launched, "reason": None}


def test_a_launch_that_failed_after_making_its_run_did_not_start_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run_dir = root / "runs" / RUN
    run_dir.mkdir(parents=True)  # its wrapper did not start (screen refused): the launch recorded the run failed
    (run_dir / "spec.json").write_text(json.dumps({"runId": RUN, "base": "lost", "command": "true", "python": sys.executable}))
    (run_dir / "state.json").write_text(json.dumps({"id": RUN, "state": "failed", "reason": "screen could not start the run's wrapper"}))
    assert agent(root, "launch-outcome", "--run", RUN) == {
        "runId": RUN,
        "launched": None,
        "reason": "screen could not start the run's wrapper",
    }


def test_a_run_id_is_checked_before_it_becomes_a_path(tmp_path: Path) -> None:
    assert "not a run id" in agent(tmp_path, "launch-outcome", "--run", "../../etc")["error"]


def test_a_launch_killed_before_it_started_the_wrapper_did_not_start_its_run(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run_dir = root / "runs" / RUN
    run_dir.mkdir(parents=True)  # the launch made the run, then died before screen (its flock went with it)
    (run_dir / "spec.json").write_text(json.dumps({"runId": RUN, "base": "lost", "command": "true", "python": sys.executable}))
    (run_dir / "state.json").write_text(json.dumps({"id": RUN, "state": "starting", "created": time.time() - 31}))
    said = agent(root, "launch-outcome", "--run", RUN)
    assert said == {"runId": RUN, "launched": None, "reason": "the launch ended before it started the run's wrapper"}
    state = json.loads((run_dir / "state.json").read_text())
    assert state["state"] == "failed" and state["reason"] == said["reason"]  # never taken for interrupted and resumed


@pytest.mark.parametrize(
    ("ending", "lost"),
    [
        ("exit 255", True),  # the shared connection's `ssh` lost its host
        ("echo 'python3: not found' >&2; exit 127", False),  # the agent itself ended, and said why
    ],
)
@pytest.mark.parametrize("start", ["launch", "sweep-start"])
def test_a_channel_that_ends_without_an_answer_is_lost_only_when_the_connection_went(ending: str, lost: bool, start: str) -> None:
    target = lab_target()
    channel = MuxConnection(SshHost("me", "lab"), ["sh", "-c", f"read spec; {ending}", "sh"])  # (the agent's command is $1)
    with pytest.raises(RemoteError) as e:
        if start == "launch":
            agentcall.launch(channel, target, "c3BlYw==", None)
        else:  # an ordinary call, as a sweep's start is made
            agentcall.call(channel, target, "sweep-start", "--staged", STAGED, stdin=b"{}\n")
    assert isinstance(e.value, agentcall.AnswerLost) is lost
    assert lost or str(e.value) == "the gpu-train agent failed on lab (exit 127): python3: not found"


# -- a sweep's start, asked about by its staged code's name (`launch-outcome --sweep`, agent/sweep.py) ----------


def sweep_start(root: Path, stamp: str = STAMP) -> dict[str, Any]:
    """The agent's `sweep-start` as the laptop sends it, its code staged: one trial (node 0's), one slot."""
    (root / "staging" / f"{SWEEP}{stamp}").mkdir(parents=True)
    (root / "staging" / f"{SWEEP}{stamp}" / "README").write_text("a job given by --command\n")
    (root / "bin").mkdir(exist_ok=True)
    (root / "bin" / "gpu-train-agent").write_text(INSTALLED.format(root=str(ROOT)))
    job = {"runId": f"{SWEEP}{stamp}", "base": SWEEP, "command": "true", "python": sys.executable}
    trial = {"index": 0, "values": {"x": 1}, "args": ["--x", "1"], "base": f"{SWEEP}_t0_x1", "node": 0}
    record = {"name": SWEEP, "stamp": stamp, "job": job, "trials": [trial], "slots": [[]], "node": 0}
    done = subprocess.run(
        [sys.executable, "-m", "agent", "--root", str(root), "sweep-start", "--staged", f"{SWEEP}{stamp}"],
        cwd=ROOT,
        input=json.dumps(record) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_sweep_asked_about_before_its_start_kept_it_never_starts(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "staging").mkdir(parents=True)
    assert agent(root, "launch-outcome", "--run", STAGED, "--sweep", SWEEP) == {
        "runId": STAGED,
        "launched": None,
        "reason": "the sweep's start had not kept it, and now will not",
    }
    late = sweep_start(root)  # the start arrives after all: too late, the laptop was told it did not start
    assert late == {"error": f"sweep {SWEEP!r} was not started: the laptop lost its connection during its start and gave it up"}
    assert not (root / "sweeps" / SWEEP).exists() and not (root / "staging" / STAGED).exists() and not (root / "runs").exists()


def test_a_sweep_whose_start_kept_it_is_answered_as_its_start_was(tmp_path: Path) -> None:
    root = tmp_path / "root"
    started = sweep_start(root)
    assert started == {"sweep": SWEEP, "trials": 1, "slots": 1, "started": [f"{SWEEP}_t0_x1{STAMP}"]}
    assert agent(root, "launch-outcome", "--run", STAGED, "--sweep", SWEEP) == {"runId": STAGED, "launched": started, "reason": None}


def test_an_earlier_sweep_of_that_name_is_not_taken_for_the_start_asked_about(tmp_path: Path) -> None:
    root = tmp_path / "root"
    sweep_start(root, "_20240101_000000")  # an earlier sweep of the name, kept on the host
    said = agent(root, "launch-outcome", "--run", STAGED, "--sweep", SWEEP)
    assert said["launched"] is None and said["reason"] == "the sweep's start had not kept it, and now will not"
    assert "was not started: the laptop lost its connection" in sweep_start(root)["error"]
    assert json.loads((root / "sweeps" / SWEEP / "sweep.json").read_text())["stamp"] == "_20240101_000000"  # (untouched)


@pytest.mark.parametrize(("name", "staged"), [("../x", STAGED), (SWEEP, "../../etc"), ("other", STAGED)])
def test_a_sweeps_names_are_checked_before_they_become_paths(tmp_path: Path, name: str, staged: str) -> None:
    said = agent(tmp_path, "launch-outcome", "--run", staged, "--sweep", name)
    assert "are not a sweep's name and its staged code's" in said["error"]


def test_a_given_up_mark_outlives_the_staged_code_by_days(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """clean_staging clears a launch's staged code and markers after an hour, but the mark saying the laptop
    was told a launch did not start stays a week: a fan-out's relay may still say "go" hours later."""
    from agent import launch

    staging = tmp_path / "staging"
    (staging / "job_20260101_000000").mkdir(parents=True)
    (staging / "job_20260101_000000.arrived").touch()
    (staging / "job_20260101_000001.given-up").touch()
    later = time.time()
    monkeypatch.setattr("agent.launch.time.time", lambda: later + 2 * 3600)
    launch.clean_staging(str(tmp_path))
    assert sorted(p.name for p in staging.iterdir()) == ["job_20260101_000001.given-up"]
    monkeypatch.setattr("agent.launch.time.time", lambda: later + 8 * 86400)
    launch.clean_staging(str(tmp_path))
    assert list(staging.iterdir()) == []
