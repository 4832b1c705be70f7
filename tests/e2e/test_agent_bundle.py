"""The e2e tier of tests/unit/test_agent_bundle.py (the same subject; its helpers are there)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from agent import bundle


def oldest_python() -> str | None:
    """A Python 3.8 here (the oldest a host may have), or None: on PATH, or one pyenv built."""
    import glob
    import shutil

    for python in [shutil.which("python3.8"), *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))]:
        if (
            python
            and subprocess.run([python, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"], capture_output=True).returncode == 0
        ):
            return python
    return None


OLD_PYTHON = oldest_python()


@pytest.mark.skipif(
    OLD_PYTHON is None,
    reason="no Python 3.8 on this machine (PATH, ~/.pyenv): the agent under a real 3.8 is not run here; "
    "tests/unit/test_agent_oldest_python.py checks its sources against 3.8",
)
@pytest.mark.e2e
def test_the_agent_launches_a_run_and_reports_it_on_python_3_8(tmp_path: Path) -> None:
    """The zipapp as a host with Python 3.8 runs it: launch decodes the spec, the wrapper (under screen)
    writes the run's record, status reads it back through the contract."""
    from gpu_train.contract import JobSpec, RunRecord

    assert OLD_PYTHON is not None
    agent, root = tmp_path / "agent.pyz", tmp_path / "root"
    agent.write_bytes(bundle.payload())
    run_id = "old_20260101_000000"
    (root / "staging" / run_id).mkdir(parents=True)
    spec = JobSpec(
        run_id=run_id,
        base="old",
        command="python3 -c 'import sys; print(sys.version_info[:2])'",
        python=OLD_PYTHON,
        venv=False,
        agent_settings={"maxResumes": 2},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PATH"] = f"{os.path.dirname(OLD_PYTHON)}:{env['PATH']}"

    def agent_call(*args: str) -> dict:
        out = subprocess.run(
            [OLD_PYTHON, "-I", str(agent), "--root", str(root), *args], capture_output=True, text=True, timeout=60, env=env
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)

    started = agent_call("launch", base64.b64encode(json.dumps(spec.to_json()).encode()).decode())
    assert started["runId"] == run_id
    deadline = time.monotonic() + 30
    while (run := agent_call("status")["runs"][0])["state"] in ("starting", "running") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (run["state"], run["exitCode"]) == ("succeeded", 0), run
    record = RunRecord.from_json(json.loads((root / "runs" / run_id / "state.json").read_text()))
    assert (record.id, record.base, record.exit_code, record.pid_start is not None) == (run_id, "old", 0, True)
    assert "(3, 8)" in (root / "runs" / run_id / "log").read_text()
    assert JobSpec.from_json(json.loads((root / "runs" / run_id / "spec.json").read_text())).python == OLD_PYTHON
    assert agent_call("status")["agent"]["maxResumes"] == 2  # the stack's settings, checked and kept


@pytest.mark.e2e
def test_a_runs_wrapper_runs_from_the_unpacked_folder_which_stays_while_it_runs(tmp_path: Path) -> None:
    """The wrapper imports from the folder the bootstrap unpacked (Python keeps its compiled modules there;
    from the zipapp it compiles every module anew at each start), with -I -S, and holds that folder: a later
    version's call leaves it in place however old it looks while the run trains, and removes it after."""
    from gpu_train.contract import JobSpec
    from tests.unit.test_agent_bundle import versions

    root, run_id = tmp_path / "root", "held_20260101_000000"
    (root / "staging" / run_id).mkdir(parents=True)
    spec = JobSpec(run_id=run_id, base="held", command="sleep 120", python="/usr/bin/python3", venv=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}

    def call(*args: str, zipapp: bytes | None = None) -> dict:
        command = bundle.agent_command(str(root), *args, cli="gpu-train", zipapp=zipapp)
        out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        return dict(json.loads(out.stdout))

    call("launch", base64.b64encode(json.dumps(spec.to_json()).encode()).decode())
    [folder] = (root / "bin").glob(f"{bundle.UNPACKED}*")
    deadline = time.monotonic() + 30
    while (pid := json.loads((root / "runs" / run_id / "state.json").read_text()).get("pid")) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    wrapper = json.loads((root / "runs" / run_id / "state.json").read_text())["wrapperPid"]
    argv = Path(f"/proc/{wrapper}/cmdline").read_bytes().decode().split("\0")[:-1]
    assert argv[1:4] == ["-I", "-S", str(folder)] and argv[-2:] == ["wrap", run_id], argv
    assert pid is not None and (folder / bundle.PACKAGE / "__pycache__").is_dir()

    one, two = versions()
    old = time.time() - 2 * 86400
    os.utime(folder, (old, old))
    call("status", zipapp=one)  # a later version, unpacked: an unused folder a day old would go
    assert folder.is_dir(), "the running wrapper's folder was removed"
    call("stop", "--run", run_id, "--grace", "1", zipapp=one)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{wrapper}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.utime(folder, (old, old))
    call("status", zipapp=two)
    assert not folder.exists()


@pytest.mark.e2e
def test_a_run_boot_relaunches_runs_from_the_unpacked_folder_too(tmp_path: Path) -> None:
    """`boot` (cron's @reboot line, a VM's unit) runs the installed zipapp, not the bootstrap: the run it
    relaunches runs from that zipapp's unpacked folder all the same, and holds it. From the zipapp, the
    next version's call replaces the file under the wrapper, whose later imports then fail ("bad local
    file header": Python reads a zip's modules at the offsets it read at its start)."""
    import signal

    from gpu_train.contract import JobSpec

    root, run_id = tmp_path / "root", "booted_20260101_000000"
    (root / "staging" / run_id).mkdir(parents=True)
    spec = JobSpec(run_id=run_id, base="booted", command="sleep 120", python="/usr/bin/python3", venv=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    state_path = root / "runs" / run_id / "state.json"

    def started(field: str, besides: int | None = None) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = json.loads(state_path.read_text()).get(field)
            if got is not None and got != besides and json.loads(state_path.read_text()).get("pid") is not None:
                return int(got)
            time.sleep(0.05)
        raise AssertionError(f"no {field} in {state_path.read_text()}")

    launch = bundle.agent_command(str(root), "launch", base64.b64encode(json.dumps(spec.to_json()).encode()).decode(), cli="gpu-train")
    assert subprocess.run(["bash", "-c", launch], capture_output=True, timeout=60, env=env).returncode == 0
    [folder] = (root / "bin").glob(f"{bundle.UNPACKED}*")
    first = started("wrapperPid")
    victims = (first, json.loads(state_path.read_text())["pid"])
    for pid in victims:  # the machine went down: nothing of the run is left
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{p}").exists() for p in victims) and time.monotonic() < deadline:
        time.sleep(0.05)

    agent = root / "bin" / "gpu-train-agent"
    booted = subprocess.run(["python3", str(agent), "--root", str(root), "boot"], capture_output=True, text=True, timeout=60, env=env)
    assert [a["action"] for a in json.loads(booted.stdout)["actions"]] == ["resumed"], booted.stdout + booted.stderr
    wrapper = started("wrapperPid", besides=first)
    try:
        argv = Path(f"/proc/{wrapper}/cmdline").read_bytes().decode().split("\0")[:-1]
        assert argv[1:4] == ["-I", "-S", str(folder)] and argv[-2:] == ["wrap", run_id], argv
    finally:
        stop = bundle.agent_command(str(root), "stop", "--run", run_id, "--grace", "1", cli="gpu-train")
        subprocess.run(["bash", "-c", stop], capture_output=True, timeout=60, env=env)
