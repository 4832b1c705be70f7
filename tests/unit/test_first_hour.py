"""What a new user types in the first hour (issue 38, point 6): `train x.py`, a script's flag outside --args,
`TASK --help`, and this clone's scripts as subcommands (`gpu-train plan`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from remote import cli
from remote.tasks import ns
from tests.conftest import ROOT

TASKS = set(ns.task_names)
TRAIN = cli._flags(next(c for c in ns.to_contexts() if c.name == "train"))


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        (["train", "x.py", "--max-steps", "10"], "--args '--max-steps 10'"),
        (["train", "--script", "x.py", "--max_steps=10"], "--args '--max_steps=10'"),
        (["train", "--script", "x.py", "--args", "--max-steps 10"], None),  # in --args: the script's
        (["train", "-s", "lab", "-f", "x.py"], None),
        (["train", "--follow", "x.py", "status"], None),
        (["status", "--max-steps"], None),  # another task's flags are its parser's business
        (["train", "x.py", "--", "--max-steps"], None),
    ],
)
def test_a_scripts_flag_outside_args_says_where_it_goes(argv: list[str], refused: str | None) -> None:
    said = cli.script_flag(argv, TRAIN, TASKS)
    assert (said is None) if refused is None else (refused in (said or "") and "not an option of train" in (said or ""))


def test_task_help_and_scripts_as_subcommands() -> None:
    assert cli.help_asked(["train", "--help"], TASKS) == "train"
    assert cli.help_asked(["train", "x.py", "-h"], TASKS) == "train"
    assert cli.help_asked(["ssh", "--", "cmd", "--help"], TASKS) is None
    assert cli.help_asked(["train", "x.py"], TASKS) is None
    assert cli.script_argv(["gpu-train", "plan", "--stack", "t4"]) == [str(ROOT / "scripts" / "plan"), "--stack", "t4"]
    assert cli.script_argv(["gpu-train", "status"]) is None


def test_train_takes_its_script_as_a_word(tmp_path) -> None:
    """Through the real command: `train x.py` reaches the stack selection (not "No idea what 'x.py' is"), a
    script flag is refused before anything is done."""
    (tmp_path / "x.py").write_text("print(1)\n")
    (tmp_path / ".git").mkdir()

    def run(*argv: str) -> subprocess.CompletedProcess:
        code = "import sys; from remote.cli import main; sys.argv[0] = 'gpu-train'; main()"
        return subprocess.run([sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120)

    bare = run("train", "x.py")
    assert bare.returncode == 2 and "no stack selected" in bare.stderr and "No idea" not in bare.stderr, bare.stderr
    flag = run("train", "x.py", "--max-steps", "10")
    assert flag.returncode == 2 and "--args '--max-steps 10'" in flag.stderr, flag.stderr


@pytest.mark.parametrize(
    ("argv", "status", "said"),
    [
        (["train", "x.py", "--help"], 0, "[--core-opts] train [--options]"),  # help, not a run of a script called --help
        (["train", "x.py", "--max-steps", "10"], 2, "--args '--max-steps 10' (train's own: {cli} --help train)"),
        (["trian"], 2, "No idea what 'trian' is! Did you mean train?"),
        (["train", "--scirpt", "x.py"], 2, "No idea what '--scirpt' is! Did you mean --script?"),
    ],
)
@pytest.mark.parametrize("cli_name", ["gpu-train", "fab"])
def test_fab_and_gpu_train_parse_a_task_line_alike(tmp_path, cli_name: str, argv: list[str], status: int, said: str) -> None:
    """`fab` (Fabric's program, in the clone) lacked what `gpu-train` added: `train x.py --help` ran a train
    of a script called --help, a script's flag got "No idea what '10' is!", a typo no "did you mean", and each
    exited 1. Both now parse with remote/cli.py's TaskLine."""
    import os

    from tests.conftest import FAB

    (tmp_path / "x.py").write_text("print(1)\n")
    (tmp_path / ".git").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_TRAIN_HOME": str(tmp_path / "state")}
    command = [FAB, "--search-root", str(ROOT)] if cli_name == "fab" else [str(Path(sys.executable).parent / "gpu-train")]
    done = subprocess.run([*command, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == status and said.format(cli=cli_name) in done.stdout + done.stderr, done.stdout + done.stderr
    assert "no stack selected" not in done.stderr  # nothing ran


@pytest.mark.parametrize(
    ("log", "failed", "shown"),
    [
        ("step 9\n=====\n", False, "step 9"),  # a rule is no line to show
        ("Traceback\nKeyboardInterrupt\n[gpu-train] r: resumed (1), same RUN_ID\nstep 12\n", False, "step 12"),
        # an earlier leg's exception is not the latest leg's: it failed without one of its own
        ("Traceback\nKeyboardInterrupt\n[gpu-train] r: resumed (1), same RUN_ID\nloading\n", True, "loading"),
        ("step 1\nTraceback (most recent call last):\nValueError: boom\n-----\n", True, "ValueError: boom"),
        ("[gpu-train] pip failed\n", True, "[gpu-train] pip failed"),
    ],
)
def test_status_last_line_is_the_latest_legs_own(log: str, failed: bool, shown: str) -> None:
    from agent.store import job_line

    assert job_line(log, failed) == shown


def test_setup_says_the_agents_settings_in_words() -> None:
    from remote.tasks.render import settings_lines

    assert settings_lines({"idleStopMinutes": 0, "maxResumes": 10}) == [
        "idle stop: off",
        "resumes: a run is relaunched at most 10 times (reboots, preemptions, resume)",
    ]
    said = settings_lines({"idleStopMinutes": 30, "maxResumes": 3, "maxRunHours": 24, "poweroffCommand": ["sudo", "poweroff"]})
    assert said[0] == "idle stop: after 30 idle minutes (sudo poweroff)" and said[-1].startswith("run-time cap: 24 h")
    assert not any("{" in line for line in said)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc: Linux)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # not a process, or gone meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def gone(pid: int) -> bool:
    """No such process, or a zombie (ended, not yet reaped by its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_tensorboard_serves_a_fetched_run_with_no_host(tmp_path, stop: str) -> None:
    """After `down` the host is gone: `tensorboard --fetched` serves runs/STACK/RUN here (its workdir's events too),
    until Ctrl-C, a process manager's SIGTERM or a closed terminal's SIGHUP, any of which ends its TensorBoard too."""
    import json
    import os
    import signal
    import time
    import urllib.request

    pytest.importorskip("tensorboard")
    run = tmp_path / "runs" / "lab" / "train_20260101_000000"
    (run / "workdir" / "out").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    code = "import sys; from remote.cli import main; sys.argv[0] = 'gpu-train'; main()"
    # A proxy for plain HTTP and no no_proxy, as many workplaces set: the local TensorBoard is asked directly.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_TRAIN_HOME": str(tmp_path / "state"), "http_proxy": "http://127.0.0.1:9"}
    env = {k: v for k, v in env.items() if k.lower() != "no_proxy"}
    argv = [sys.executable, "-c", code, "tensorboard", "--fetched", "--stack", "lab", "--json", "--run"]
    tensorboard: list[int] = []
    err = tmp_path / "stderr"  # (a file: a pipe would stay open while a TensorBoard left behind holds it)
    with (
        err.open("w") as stderr,
        subprocess.Popen([*argv, run.name], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True) as served,
    ):
        try:
            line = served.stdout.readline()  # type: ignore[union-attr]  # (a PIPE: never None)
            assert line, err.read_text()
            url, deadline = json.loads(line)["url"], time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(url + "data/logdir", timeout=5) as page:
                        assert str(run) in page.read().decode()
                        break
                except OSError:
                    assert time.monotonic() < deadline, "TensorBoard did not answer"
                    time.sleep(0.1)
            tensorboard = children(served.pid)
            assert len(tensorboard) == 1, tensorboard
        finally:
            served.send_signal(getattr(signal, stop))  # only to the command, not to its process group as a terminal would
            try:
                status = served.wait(30)
            except subprocess.TimeoutExpired:
                served.kill()  # (else leaving the `with` would wait for it for ever)
                status = None
            deadline = time.monotonic() + 30
            while not all(gone(pid) for pid in tensorboard) and time.monotonic() < deadline:
                time.sleep(0.05)
            left = [pid for pid in tensorboard if not gone(pid)]
            for pid in left:  # (the old way: TensorBoard left running, its parent gone)
                os.kill(pid, signal.SIGKILL)
    assert not left, f"{stop} left TensorBoard (pid {left}) running"
    said = err.read_text()
    assert status == 0 and "tensorboard here over" in said, said  # ended as Ctrl-C ends it
    try:  # nothing answers there any more, or (tests at once) another's TensorBoard took the port since
        with urllib.request.urlopen(url + "data/logdir", timeout=5) as page:
            assert json.loads(page.read())["logdir"] != str(run)
    except OSError:
        pass
    missing = subprocess.run([*argv, "nope_20260101_000000"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert missing.returncode == 2 and "nothing fetched at" in missing.stderr


def test_stack_and_run_values_complete(tmp_path) -> None:
    """`gpu-train logs --stack <TAB>` completes the project's stacks, `--run <TAB>` the runs it has seen (fetched,
    or listed by the last status), with no host asked; other words are Invoke's (tasks, flags)."""
    import os

    from remote.tasks.completion import SeenRuns

    (tmp_path / "stacks").mkdir()
    for name in ("lab", "gcp"):
        (tmp_path / "stacks" / f"Pulumi.{name}.yaml").write_text("config: {}\n")
    (tmp_path / "runs" / "lab" / "fit_20260101_000000").mkdir(parents=True)
    SeenRuns(tmp_path / "state").write("lab", ["train_20260102_000000"])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_TRAIN_HOME": str(tmp_path / "state")}
    env.pop("GPU_TRAIN_STACK", None)
    env.pop("GPU_TRAIN_STACKS_DIR", None)

    def complete(line: str) -> list[str]:
        code = "import sys; from remote.cli import main; sys.argv[0] = 'gpu-train'; main()"
        done = subprocess.run(
            [sys.executable, "-c", code, "--complete", "--", *line.split()], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        return done.stdout.split()

    assert {"gcp", "lab"} <= set(complete("gpu-train status --stack"))
    assert complete("gpu-train logs --stack lab --run") == ["fit_20260101_000000", "train_20260102_000000"]
    assert complete("gpu-train logs -s lab -r fit") == ["fit_20260101_000000", "train_20260102_000000"]  # the shell filters
    assert "train" in complete("gpu-train")  # task names, as before


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        # --args without quotes: it takes the first word, the others would be read as tasks ("No idea what '3' is!")
        (["train", "x.py", "--args", "--epochs", "3"], "--args '--epochs 3'"),
        (["train", "x.py", "--args", "--lr", "0.1", "--epochs", "3", "--follow"], "--args '--lr 0.1 --epochs 3'"),
        (["train", "--script", "x.py", "--resume-args", "--ckpt_path", "last"], "--resume-args '--ckpt_path last'"),
        (["train", "--args", "--epochs", "3", "x.py"], "--args '--epochs 3'"),  # x.py: train's positional script
        (["train", "x.py", "--args", "--verbose"], None),  # one word: fine as it is
        (["train", "x.py", "--args", "--verbose", "--follow"], None),
        (["train", "--args", "--verbose", "x.py"], None),
        (["train", "x.py", "--args", "--verbose", "status"], None),  # then another task
        (["train", "x.py", "--args", "--epochs 3"], None),  # quoted
        (["train", "x.py", "--args=--epochs", "3"], None),  # (Invoke's own "No idea what '3' is!")
    ],
)
def test_args_given_unquoted_says_to_quote_them(argv: list[str], refused: str | None) -> None:
    said = cli.script_flag(argv, TRAIN, TASKS)
    assert (said is None) if refused is None else (refused in (said or "") and "one quoted string" in (said or "")), said


CONTEXTS = {c.name: c for c in ns.to_contexts()}


@pytest.mark.parametrize(
    ("tokens", "start"),
    [
        (["train", "x.py"], 0),
        (["status", "train", "x.py"], 1),
        (["logs", "--run", "train", "--lines", "2"], None),  # a run's base name: train.py's newest run
        (["logs", "-r", "train", "-f"], None),
        (["fetch", "--run=train", "train", "x.py"], 2),
        (["sweep", "--name", "train", "--values", "lr=1,2"], None),
        (["sweep", "train"], None),  # sweep's positional (its action): refused by sweep, not a train
        (["ssh", "--", "train"], None),
    ],
)
def test_where_train_starts_on_a_command_line(tokens: list[str], start: int | None) -> None:
    assert cli.task_start(tokens, "train", CONTEXTS) == start


def test_a_run_named_train_is_no_train(tmp_path: Path) -> None:
    """`logs --run train --lines 2` (train.py's newest run) was refused: "--lines is not an option of train"."""
    said = subprocess.run(
        [str(Path(sys.executable).parent / "gpu-train"), "logs", "--run", "train", "--lines", "2", "--stack", "nosuch"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)},
    )
    assert "not an option of train" not in said.stderr and "nosuch" in said.stderr, said.stderr


SWEEP = cli._flags(CONTEXTS["sweep"])


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        # sweep's positional (its action) took the script's flag: "No idea what '3' is!", "sweep '10': use one of ..."
        (["sweep", "--script", "x.py", "--epochs", "3", "--values", "lr=1,2"], "--epochs is not an option of sweep"),
        (["sweep", "--script", "x.py", "--args", "--C", "10", "--values", "lr=1,2"], "--args '--C 10'"),
        (["sweep", "--script", "x.py", "--valeus", "lr=1,2"], "Did you mean --values?"),
        (["sweep", "--script", "x.py", "--args", "--epochs 3", "--values", "lr=1,2"], None),
        (["sweep", "status", "--sweep", "lrgrid", "--metric", "eval/loss"], None),
        (["sweep", "--args", "--verbose", "stop"], None),  # stop: sweep's action
    ],
)
def test_a_scripts_flag_outside_a_sweeps_args(argv: list[str], refused: str | None) -> None:
    said = cli.script_flag(argv, SWEEP, TASKS, task="sweep", positional=lambda word: word in ("start", "status", "best", "stop"))
    assert (said is None) if refused is None else (refused in (said or "")), said


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("step 1\n 27%|##7 | 53/196\x1b[A", "step 1\n 27%|##7 | 53/196\x1b[A\n[gpu-train] r: stopped, exit code -9\n"),  # tqdm: mid-line
        ("step 1\n", "step 1\n[gpu-train] r: stopped, exit code -9\n"),
        ("", "[gpu-train] r: stopped, exit code -9\n"),
    ],
)
def test_a_note_of_ours_starts_a_line_of_its_own(tmp_path: Path, before: str, after: str) -> None:
    """A job killed mid progress bar leaves its log mid-line: the wrapper's note was glued to the bar (`logs` and
    status's LAST LINE showed `27%|..| 53/196\\x1b[A[gpu-train] r: stopped, exit code -9`)."""
    from agent.wrap import Wrapper

    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "log").write_text(before)
    with open(run_dir / "log", "ab", buffering=0) as log:
        Wrapper(str(tmp_path), "r", log).say("r: stopped, exit code -9")
    assert (run_dir / "log").read_text() == after
