"""Hostile stack files, a lying host and bad options, through the real `fab` against real sshds.

Each case asserts that nothing ran (marker files), nothing was written outside its place, and that
the message names the problem. The lying host is an sshd whose key is bound to a forced command:
agent calls get crafted documents, rsync runs for real (so a fetch would really write files).
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remote.loopback import Sshd
from tests.conftest import EXAMPLE, FAB, Lab

LAB_ADDRESS = "127.0.10.2"  # this suite's loopback addresses are 127.0.10.x (the `lab` fixture reads it)


def no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr + result.stdout, "\n" + result.stderr


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


# -- hostile stack files: refused before anything runs ------------------------------------------
@pytest.mark.parametrize(
    ("setting", "value", "words"),
    [
        ("hosts", "['root@{addr}\\n  ProxyCommand touch {mark}']", "hosts"),
        ("hosts", "['-oProxyCommand=touch {mark}@{addr}']", "hosts"),
        ("remoteRoot", "'/tmp/x\"; touch {mark}; \"'", "remoteRoot"),
        ("remoteRoot", "'~/$(touch {mark})'", "remoteRoot"),
        ("sshKey", '"/k\\n  ProxyCommand touch {mark}"', "sshKey"),
        ("python", "'-c'", "python"),
        ("maxResumes", "-2", "maxResumes"),
        ("idleStopMinutes", "-5", "idleStopMinutes"),
    ],
)
@pytest.mark.parametrize("task", [["ssh"], ["train", "--command", "true"]])
def test_hostile_stack_values_run_nothing(lab: Lab, setting: str, value: str, words: str, task: list[str]) -> None:
    mark = lab.tmp / "marker"
    value = value.format(addr=lab.sshd.address, mark=mark)
    stack = lab.stacks / "Pulumi.lab.yaml"
    lines = [ln for ln in stack.read_text().splitlines() if f"gpu-train:{setting}:" not in ln]
    stack.write_text("\n".join(lines) + f"\n  gpu-train:{setting}: {value}\n")
    before = files_under(lab.home)
    args = [*task, "--dir", str(EXAMPLE)] if task[0] == "train" else task
    result = lab.fab(*args)
    assert result.returncode == 2, result.stderr
    assert f"gpu-train:{words}" in result.stderr
    no_traceback(result)
    assert not mark.exists() and not lab.remote.exists()
    assert files_under(lab.home) == before  # no ssh config entry, no known_hosts line


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["train", "--command", "true", "--nproc", "abc"], "--nproc"),
        (["train", "--command", "true", "--port", "abc"], "--port"),
        (["train", "--command", "true", "--timeout", "abc"], "--timeout"),
        (["train", "--script", "train.py", "--args", "it's"], "--args"),
        (["logs", "--lines", "x"], "--lines"),
        (["fetch", "--run", "../../x"], "--run"),
        (["fetch", "--run", "$(touch MARK)"], "--run"),
        (["logs", "--run", "../x"], "--run"),
        (["stop", "--run", "a/b"], "--run"),
        (["tunnel", "--port", "abc"], "--port"),  # (an int default let Invoke parse it: a ValueError traceback)
        (["tunnel", "--local-port", "abc"], "--local-port"),
        (["tensorboard", "--local-port", "99999"], "--local-port"),
        (["fetch", "--streams", "abc"], "--streams"),
        (["down", "--streams", "0"], "--streams"),
    ],
)
def test_bad_options_are_messages(lab: Lab, args: list[str], words: str) -> None:
    mark = lab.tmp / "MARK"
    args = [a.replace("MARK", str(mark)) for a in args]
    if args[0] == "train":
        args += ["--dir", str(EXAMPLE)]
    result = lab.fab(*args)
    assert result.returncode != 0 and words in result.stderr, result.stderr
    no_traceback(result)
    assert not mark.exists() and not (lab.cwd / "runs").exists()


def test_a_file_that_is_not_a_key_is_said_at_once(lab: Lab) -> None:
    bad = lab.tmp / "not-a-key"
    bad.write_text("hello\n")
    stack = lab.stacks / "Pulumi.lab.yaml"
    stack.write_text(stack.read_text().replace(str(lab.sshd.client_key), str(bad)))
    result = lab.fab("status", timeout=10)
    assert result.returncode == 3 and "is not an SSH private key" in result.stderr and "sshKey" in result.stderr
    no_traceback(result)


def test_closed_pipe_is_quiet(lab: Lab, plain: str) -> None:
    lab.train("--dir", plain, "--command", "true", "--name", "a")
    fab = [sys.executable, "-m", "fabric", "--search-root", str(Path(__file__).parents[2]), "status"]
    script = f"{shlex.join(fab)} | true; echo rc=${{PIPESTATUS[0]}} >&2"
    result = subprocess.run(["bash", "-c", script], env=lab.env, cwd=lab.cwd, capture_output=True, text=True, timeout=60)
    no_traceback(result)
    assert "Exception ignored" not in result.stderr


def test_old_rsync_argument_parsing_changes_nothing(lab: Lab) -> None:
    """RSYNC_OLD_ARGS=1 makes a new rsync parse as old ones did (remote paths through the shell)."""
    code = lab.tmp / "code"
    code.mkdir()
    (code / "a b $(touch MARK).py").write_text("x = 1\n")
    (code / "train.py").write_text("import os; open(os.environ['JOB_DIR'] + '/out $(x).txt', 'w').write('ok')\n")
    env = {**lab.env, "RSYNC_OLD_ARGS": "1"}
    out = subprocess.run(
        [*fab_argv(lab), "train", "--dir", str(code), "--script", "train.py", "--name", "old"],
        env=env,
        cwd=lab.cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    run = out.stdout.split()[1]
    lab.wait(run)
    assert (lab.remote / "runs" / run / "code" / "a b $(touch MARK).py").is_file()
    got = subprocess.run([*fab_argv(lab), "fetch", "--run", run], env=env, cwd=lab.cwd, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert (lab.cwd / "runs" / "lab" / run / "out $(x).txt").read_text() == "ok"
    assert not list(lab.tmp.rglob("MARK")) and not (lab.cwd / "MARK").exists()


def fab_argv(lab: Lab) -> list[str]:
    from tests.conftest import FAB, ROOT

    return [FAB, "--search-root", str(ROOT)]


# -- a lying host -------------------------------------------------------------------------------
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
with open(doc_path) as f:
    print(f.read())
"""


def _end_shared_connection(lab: Lab) -> None:
    from gpu_train.gcp.catalog_file import load_catalog
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
        self.doc.write_text(
            json.dumps({"root": str(self.lab.remote), "runs": list(runs), "gpus": [], "uptimeS": 1, "host": "liar", "agent": {}, "now": 0})
        )


def lying_run(run_id: object, job_dir: str, state: str = "succeeded") -> dict:
    return {
        "id": run_id,
        "base": "x",
        "state": state,
        "exitCode": 0,
        "jobDir": job_dir,
        "log": "",
        "lastLine": "",
        "resumes": 0,
        "preemptions": 0,
        "created": 1,
        "durationS": 1,
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
    assert result.returncode != 0 and "not a run id" in result.stderr, result.stderr
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


# -- a cluster starts whole or not at all ---------------------------------------------------------
@pytest.mark.e2e
def test_a_node_lost_mid_sync_fails_the_launch_and_stops_the_others(tmp_path: Path) -> None:
    nodes = [Sshd(tmp_path / f"n{i}", f"127.0.10.{3 + i}") for i in range(3)]
    for n in nodes[1:]:
        n.client_key = nodes[0].client_key
    for n in nodes:
        n.start()
    roots = [tmp_path / f"node{i}" for i in range(3)]
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    hosts = ", ".join(f"'{n.spec}'" for n in nodes)
    (stacks / "Pulumi.trio.yaml").write_text(
        f"config:\n  gpu-train:target: ssh\n  gpu-train:hosts: [{hosts}]\n  gpu-train:sshKey: {nodes[0].client_key}\n"
        f"  gpu-train:remoteRoot: {tmp_path}/node{{node}}\n  gpu-train:python: {sys.executable}\n"
    )
    code = tmp_path / "code"
    code.mkdir()
    for i in range(4):
        (code / f"blob{i}.bin").write_bytes(os.urandom(8 << 20))  # enough to be mid-sync when node 1 dies
    (code / "job.sh").write_text("sleep 30\n")
    home = tmp_path / "home"
    env = {**os.environ, "GPU_TRAIN_STACKS_DIR": str(stacks), "GPU_TRAIN_HOME": str(home), "GPU_TRAIN_STACK": "trio"}
    from tests.conftest import ROOT

    proc = subprocess.Popen(
        [FAB, "--search-root", str(ROOT), "train", "--dir", str(code), "--command", "sh job.sh", "--name", "trio"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if any((roots[1] / "staging").glob("*/*blob*")) or any((roots[1] / "staging").glob("*/.*blob*")):
                break  # rsync is writing node 1's code (its temp files are dot files)
            time.sleep(0.005)
        assert proc.poll() is None, "fab train ended before the sync to node 1 began:\n" + "".join(proc.communicate())
        nodes[1].stop()  # the daemon and every session it serves, mid-sync
        out, err = proc.communicate(timeout=120)
        assert proc.returncode != 0, out + err
        assert "started" not in out and "node 1" in err, out + err
        no_traceback(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        for i in (0, 2):  # the others were stopped or never started: no half a cluster left running
            for state in (roots[i] / "runs").glob("*/state.json"):
                assert json.loads(state.read_text())["state"] in ("stopped", "failed"), state.read_text()
        manifests = home / "trio" / "code-manifests.json"
        assert not manifests.exists() or json.loads(manifests.read_text()) == {}  # nothing recorded as pushed
    finally:
        if proc.poll() is None:
            proc.kill()
        for n in nodes:
            n.stop()
        for r in roots:
            subprocess.run(["pkill", "-f", str(r)], check=False)


def test_a_128_character_name_runs_under_a_short_screen_name(lab: Lab, plain: str) -> None:
    name = "n" * (128 - len("_20260101_000000"))
    run = lab.train("--dir", plain, "--command", "echo long-name-ok", "--name", name)
    assert len(run) == 128
    assert lab.wait(run)["state"] == "succeeded" and "long-name-ok" in lab.log(run)


def test_a_hosts_escape_sequences_reach_the_terminal_written_out(lab: Lab, liar: Liar) -> None:
    # A host's words (a run's last line, its detail, the host name, an error) are printed by status:
    # raw, an escape sequence could retitle the window, clear the screen or answer back as input.
    run = lying_run("planted_1", "x", state="failed")
    run.update(lastLine="loss \x1b]0;pwned\x07", detail="\x1b[2J", reason="\x9b6n")
    liar.answer(run)
    doc = json.loads(liar.doc.read_text())
    liar.doc.write_text(json.dumps({**doc, "host": "liar\x1b[8m", "\x1b[5mkey": 1}))
    result = lab.fab("status")
    no_traceback(result)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout + result.stderr and "\x9b" not in result.stdout
    assert "loss \\x1b]0;pwned\\x07" in result.stdout and "liar\\x1b[8m" in result.stdout
    liar.doc.write_text(json.dumps({"error": "no such run \x1b]2;owned\x07"}))
    for task in (["status"], ["train", "--command", "true", "--dir", str(EXAMPLE)], ["stop"], ["resume"]):
        result = lab.fab(*task)
        no_traceback(result)
        assert result.returncode != 0 and "\x1b" not in result.stderr, (task, result.stderr)
        assert "\\x1b]2;owned" in result.stderr, (task, result.stderr)


@pytest.mark.parametrize("task", [["ssh", "--command", "true"], ["fetch"], ["train", "--command", "true"]])
def test_a_hostile_ssh_config_runs_nothing(lab: Lab, task: list[str]) -> None:
    # sshConfig may name any file (a shared lab one): its User goes before the destination on ssh and
    # rsync command lines, where "-oProxyCommand=..." would run a command on the laptop.
    mark = lab.tmp / "marker"
    config = lab.tmp / "shared_ssh_config"
    config.write_text(f'Host labbox\n  HostName {lab.sshd.address}\n  Port {lab.sshd.port}\n  User "-oProxyCommand=touch {mark}"\n')
    stack = lab.stacks / "Pulumi.lab.yaml"
    lines = [ln for ln in stack.read_text().splitlines() if not ln.strip().startswith(("gpu-train:hosts", "- "))]
    stack.write_text("\n".join(lines) + f"\n  gpu-train:hosts: [labbox]\n  gpu-train:sshConfig: {config}\n")
    args = [*task, "--dir", str(EXAMPLE)] if task[0] == "train" else task
    result = lab.fab(*args)
    no_traceback(result)
    assert result.returncode != 0 and "starts with '-'" in result.stderr, result.stderr
    assert not mark.exists()


def test_an_agent_answer_that_never_ends_is_cut_off(lab: Lab, liar: Liar) -> None:
    # `status` that never stops writing: the old call read it all into memory, with no end.
    Path(f"{liar.doc}.flood").touch()
    started = time.monotonic()
    result = lab.fab("status", timeout=120)
    no_traceback(result)
    assert result.returncode != 0 and "answered more than" in result.stderr, result.stderr
    assert time.monotonic() - started < 60


def test_an_agent_call_that_never_answers_times_out(lab: Lab, liar: Liar, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_train.gcp.catalog_file import load_catalog
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
