"""A lying host: an sshd whose key is bound to a forced command, through the real `fab`.

Its own module because it is one stand-in with its own machinery (the forced command, crafted agent
documents): agent calls get those documents, rsync runs for real (so a fetch would really write files).
Each case asserts that nothing was written outside its place, and that the message names the problem.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE, Lab
from tests.e2e.test_hostile_hosts import files_under, no_traceback

LAB_ADDRESS = "127.0.10.6"  # 127.0.10.x: the hostile suites (the `lab` fixture reads it)


LIAR = r"""import json, os, sys
doc_path, log_path = sys.argv[1:3]
cmd = os.environ.get("SSH_ORIGINAL_COMMAND", "")
with open(log_path, "a") as f:
    f.write(cmd[:300].replace("\n", " ") + "\n")
if "rsync --server" in cmd or "fetch-serve" in cmd:  # bulk data: the real thing
    os.execvp("sh", ["sh", "-c", cmd])
if os.path.exists(doc_path + ".flood"):  # an answer that never ends
    while True:
        sys.stdout.write("x" * 65536)
if os.path.exists(doc_path + ".hang"):  # or never comes
    import time
    time.sleep(30)  # (longer than any timeout the tests set; no session left behind for long)
if " stop " in cmd and os.path.exists(doc_path + ".stop"):  # `stop` answers a Stopped
    doc_path += ".stop"
with open(doc_path) as f:
    print(f.read())
"""


def _end_shared_connection(lab: Lab) -> None:
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.stack.stackfile import load_stack
    from remote.ssh import mux
    from remote.ssh.target import target_from

    target = target_from(load_stack("lab", load_catalog(), [lab.stacks], "gpu-train"), None, lab.home)
    path = mux.control_path(target, target.host)
    if path is not None:
        subprocess.run(["ssh", "-o", f"ControlPath={path}", "-O", "exit", "x"], capture_output=True, check=False)


class Liar:
    """The lab's sshd, its key bound to a forced command answering crafted documents."""

    def __init__(self, lab: Lab):
        self.lab = lab
        self.doc = lab.tmp / "liar.json"
        self.log = lab.tmp / "liar.log"
        script = lab.tmp / "liar.py"
        script.write_text(LIAR)
        keys = lab.sshd.dir / "authorized_keys"
        command = f"{sys.executable} {script} {self.doc} {self.log}"
        keys.write_text(f'command="{command}" {keys.read_text().strip()}\n')  # read by sshd at each login
        _end_shared_connection(lab)  # logged in before the lie: a task would ride on it (remote/ssh/mux.py)

    def answer(self, *runs: dict) -> None:
        """`status` lists ``runs``; `stop` says it stopped the first."""
        if runs:
            stopped = {"runId": runs[0]["id"], "state": "stopped", "signals": []}
            Path(f"{self.doc}.stop").write_text(json.dumps(stopped))
        self.doc.write_text(
            json.dumps(
                {"root": str(self.lab.remote), "runs": list(runs), "gpus": [], "uptimeS": 1, "host": "liar", "agent": AGENT, "now": 0}
            )
        )


AGENT = {"idleStopMinutes": 0, "maxResumes": 10, "maxRunHours": None, "idleSince": None, "idleWhy": None, "installed": True}


def lying_run(run_id: object, job_dir: str, state: str = "succeeded") -> dict:
    """A run as the contract declares it (answers.RunStatus), every field there: the lie is in its values."""
    return {
        "id": run_id,
        "base": "x",
        "project": None,
        "state": state,
        "exitCode": 0,
        "jobDir": job_dir,
        "log": "",
        "lastLine": "",
        "resumes": 0,
        "preemptions": 0,
        "created": 1,
        "started": 1,
        "ended": 2,
        "durationS": 1,
        "returns": [],
        "reason": None,
        "pid": None,
        "jobSummary": {"files": 1, "bytes": 1, "newestNs": 1},
    }


@pytest.fixture
def liar(lab: Lab) -> Liar:
    lab.fab("status", check=True)  # learn the host key from the honest host first
    return Liar(lab)


LYING_IDS = ["../../../victim3/planted", "ok/../../../../victim3/planted", "..", "/tmp/abs", "a" * 500, 12, None]
TASKS_TAKING_IDS = [
    ["fetch", "--all"],
    ["down"],
    ["fetch", "--watch", "--interval", "0.1"],
    ["fetch", "--all-nodes"],
    ["resume"],
    ["stop"],
    ["status"],
]


@pytest.mark.parametrize(("task", "bad_id"), [(["fetch"], i) for i in LYING_IDS] + [(t, LYING_IDS[0]) for t in TASKS_TAKING_IDS])
def test_lying_run_ids_write_nothing(lab: Lab, liar: Liar, task: list[str], bad_id: object) -> None:
    secrets = lab.tmp / "host-secrets"
    secrets.mkdir()
    (secrets / "id_rsa").write_text("secret")
    liar.answer(lying_run(bad_id, str(secrets)))
    victim = lab.tmp / "victim3"
    before = files_under(lab.tmp) - files_under(lab.cwd)
    result = lab.fab(*task)
    no_traceback(result)
    # An id that is a string is checked as a run id; anything else is not what the contract declares.
    said = "not a run id" if isinstance(bad_id, str) else f"runs[0]'s id is {bad_id!r}, not a str"
    assert result.returncode != 0 and said in result.stderr, result.stderr
    assert not victim.exists() and not (lab.cwd / "runs").exists()
    after = files_under(lab.tmp) - files_under(lab.cwd)
    assert {p for p in after - before if not p.startswith(("home", "sshd", "liar"))} == set()
    assert "rsync" not in liar.log.read_text() and "fetch-serve" not in liar.log.read_text()


def test_lying_job_dir_is_ignored_and_fetched_modes_are_safe(lab: Lab, liar: Liar) -> None:
    secrets = lab.tmp / "host-secrets"
    secrets.mkdir()
    (secrets / "id_rsa").write_text("secret")
    job = lab.remote / "runs" / "planted_1" / "job"
    job.mkdir(parents=True)
    (job / "real.txt").write_text("ok")
    os.chmod(job / "real.txt", 0o6777)
    (job / "escape").symlink_to("/etc/passwd")
    liar.answer(lying_run("planted_1", str(secrets)))
    result = lab.fab("fetch")
    no_traceback(result)
    assert result.returncode == 0, result.stderr
    local = lab.cwd / "runs" / "lab" / "planted_1"
    assert sorted(p.name for p in local.iterdir()) == ["real.txt"]  # not the host's secrets, no escaping link
    mode = stat.S_IMODE((local / "real.txt").stat().st_mode)
    assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWGRP | stat.S_IWOTH), oct(mode)
    assert str(secrets) not in liar.log.read_text()


def test_a_hosts_escape_sequences_reach_the_terminal_written_out(lab: Lab, liar: Liar) -> None:
    # A host's words (a run's last line, its detail, the host name, an error) are printed by status:
    # raw, an escape sequence could retitle the window, clear the screen or answer back as input.
    run = lying_run("planted_1", "x", state="failed")
    run.update(lastLine="loss \x1b]0;pwned\x07", reason="\x9b6n")
    liar.answer(run)
    doc = json.loads(liar.doc.read_text())
    liar.doc.write_text(json.dumps({**doc, "host": "liar\x1b[8m"}))
    result = lab.fab("status")
    no_traceback(result)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout + result.stderr and "\x9b" not in result.stdout
    assert "loss \\x1b]0;pwned\\x07" in result.stdout and "liar\\x1b[8m" in result.stdout
    # A key the contract does not declare is refused, and named written out.
    liar.doc.write_text(json.dumps({**doc, "\x1b[5mkey": 1}))
    result = lab.fab("status")
    no_traceback(result)
    assert result.returncode != 0 and "has '\\x1b[5mkey', which StatusDoc does not declare" in result.stderr, result.stderr
    assert "\x1b" not in result.stdout + result.stderr
    liar.doc.write_text(json.dumps({"error": "no such run \x1b]2;owned\x07"}))
    Path(f"{liar.doc}.stop").unlink()  # (every call gets the error)
    for task in (["status"], ["train", "--command", "true", "--dir", str(EXAMPLE)], ["stop"], ["resume"]):
        result = lab.fab(*task)
        no_traceback(result)
        assert result.returncode != 0 and "\x1b" not in result.stderr, (task, result.stderr)
        assert "\\x1b]2;owned" in result.stderr, (task, result.stderr)


def test_an_agent_answer_that_never_ends_is_cut_off(lab: Lab, liar: Liar) -> None:
    # `status` that never stops writing: the old call read it all into memory, with no end.
    Path(f"{liar.doc}.flood").touch()
    started = time.monotonic()
    result = lab.fab("status", timeout=120)
    no_traceback(result)
    assert result.returncode != 0 and "answered more than" in result.stderr, result.stderr
    assert time.monotonic() - started < 60


def test_an_agent_call_that_never_answers_times_out(lab: Lab, liar: Liar, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.stack.stackfile import load_stack
    from remote.errors import RemoteError
    from remote.ssh import agentcall
    from remote.ssh import connect as ssh
    from remote.ssh.target import target_from

    Path(f"{liar.doc}.hang").touch()
    target = target_from(load_stack("lab", load_catalog(), [lab.stacks], "gpu-train"), None, lab.home)
    conn = ssh.open_connection(target, target.host, 10, lambda _: None)
    try:
        started = time.monotonic()
        with pytest.raises(RemoteError, match="did not answer within 2 s"):
            agentcall.call(conn, target, "status", timeout=2)
        monkeypatch.setattr(agentcall, "CALL_TIMEOUT_S", 2.0)
        with pytest.raises(RemoteError, match="did not answer within 2 s"):  # a launch's answer too
            agentcall.launch(conn, target, "{}", None)
        assert time.monotonic() - started < 15
    finally:
        conn.close()
    from remote.ssh import mux  # and on the shared connection, whose channels have no timeout of their own

    mux.start_master(target, target.host)
    deadline = time.monotonic() + 20
    while (shared := mux.reuse(target, target.host)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert shared is not None
    started = time.monotonic()
    with pytest.raises(RemoteError, match="did not answer within 2 s"):
        agentcall.launch(shared, target, "{}", None)
    assert time.monotonic() - started < 15
    _end_shared_connection(lab)
