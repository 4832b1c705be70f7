"""The laptop's Environment (gpu_train/environment.py): each GPU_TRAIN_* setting read in one place, typed,
a bad value said with its variable and fix, and handed to the tasks and scripts instead of read where used."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent import recovery_call
from agent.bundle import parse_python
from gpu_train import contract, recovery
from gpu_train.environment import CONFIG_KEY, Environment, SettingError, settings
from gpu_train.stack import project
from tests.conftest import ROOT, parse_source

# The laptop's side: everything but the agent (the host's own environment, gpu_train/contract.py's names).
LAPTOP = [
    p
    for d in ("gpu_train", "remote", "infra", "scripts", "bench")
    for p in sorted((ROOT / d).rglob("*.py"))
    if "agent" not in p.relative_to(ROOT).parts
] + [ROOT / "fabfile.py"]
THE_ONE_PLACE = {ROOT / "gpu_train" / "environment.py", ROOT / "gpu_train" / "contract.py"}  # (the contract's: the host's)


def environment_reads(tree: ast.AST) -> list[int]:
    """Lines that read or write a GPU_TRAIN_* variable: a "GPU_TRAIN_..." key, or a NAME_ENV constant on an
    environ, looked up (``.get``, ``[...]``, ``getenv``, ``pop``, ``setdefault``) in any mapping."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in ("get", "getenv", "pop", "setdefault"):
                continue
            key, receiver = node.args[0], ast.unparse(func.value) if isinstance(func, ast.Attribute) else name
        elif isinstance(node, ast.Subscript):
            key, receiver, name = node.slice, ast.unparse(node.value), ""
        else:
            continue
        named = isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith("GPU_TRAIN_")
        constant = isinstance(key, ast.Name | ast.Attribute) and ast.unparse(key).endswith("_ENV")
        if named or (constant and ("environ" in receiver or name == "getenv")):
            found.append(node.lineno)
    return found


def test_each_setting_is_read_in_one_place() -> None:
    reads = [f"{p.relative_to(ROOT)}:{line}" for p in LAPTOP if p not in THE_ONE_PLACE for line in environment_reads(parse_source(p))]
    assert not reads, f"take the setting from the Environment (env.NAME) that the entry point hands in: {reads}"


def test_the_check_sees_the_ways_a_variable_is_read() -> None:
    tree = parse_python(
        'os.environ.get("GPU_TRAIN_HOME")\nos.environ["GPU_TRAIN_STACKS_DIR"] = x\n'
        'os.getenv(probes.COMPUTE_ENV)\nenv.get("GPU_TRAIN_STACK")\nos.environ.get(CHOICE_ENV, "")\n'
        '{"GPU_TRAIN_HOME": str(home)}\nos.environ.get("HOME")\n'
    )
    assert environment_reads(tree) == [1, 2, 3, 4, 5]


def test_every_setting_typed_from_its_variable(tmp_path: Path) -> None:
    env = Environment.from_os(
        {
            "GPU_TRAIN_STACK": "lab",
            "GPU_TRAIN_STACKS_DIR": "~/stacks",
            "GPU_TRAIN_HOME": str(tmp_path / "state"),
            "GPU_TRAIN_PROJECT": str(tmp_path),
            "GPU_TRAIN_DEBUG": "1",
            "GPU_TRAIN_SSH_CONFIG": "no",
            "GPU_TRAIN_COMPUTE_ENDPOINT": "http://127.0.0.1:9/",
            "GPU_TRAIN_SERVICEUSAGE_ENDPOINT": "http://127.0.0.1:8",
            "GPU_TRAIN_CLOUDQUOTAS_ENDPOINT": "https://q.example",
            "HOME": "/elsewhere",
        }
    )
    assert (env.stack, env.stacks_dir, env.debug, env.ssh_config) == ("lab", Path("~/stacks").expanduser(), True, False)
    assert (env.compute_endpoint, env.serviceusage_endpoint, env.cloudquotas_endpoint) == (
        "http://127.0.0.1:9",
        "http://127.0.0.1:8",
        "https://q.example",
    )
    assert env.project_root == tmp_path.resolve() and env.state_home == tmp_path / "state"
    assert [name for name, _, _ in settings()] == [
        "GPU_TRAIN_STACK",
        "GPU_TRAIN_STACKS_DIR",
        "GPU_TRAIN_HOME",
        "GPU_TRAIN_PROJECT",
        "GPU_TRAIN_DEBUG",
        "GPU_TRAIN_SSH_CONFIG",
        "GPU_TRAIN_COMPUTE_ENDPOINT",
        "GPU_TRAIN_SERVICEUSAGE_ENDPOINT",
        "GPU_TRAIN_CLOUDQUOTAS_ENDPOINT",
    ]


def test_unset_or_empty_is_the_default(tmp_path: Path) -> None:
    (tmp_path / "p" / "stacks").mkdir(parents=True)
    (tmp_path / "p" / "src").mkdir()
    env = Environment.from_os({"GPU_TRAIN_STACK": "", "GPU_TRAIN_DEBUG": " ", "GPU_TRAIN_HOME": ""}, cwd=tmp_path / "p" / "src")
    assert env.stack is None and env.debug is False and env.ssh_config is None
    assert env.compute_endpoint == "https://compute.googleapis.com"
    assert env.project_root == tmp_path / "p" and env.state_home == project.state_folder(env.user_home, tmp_path / "p")
    assert env.stack_dirs[:1] == [tmp_path / "p" / "stacks"] and env.new_stacks_dir == tmp_path / "p" / "stacks"
    assert Environment.from_os({}, cwd=tmp_path).found_project is None


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("GPU_TRAIN_COMPUTE_ENDPOINT", "localhost:8080", "GPU_TRAIN_COMPUTE_ENDPOINT='localhost:8080' is not a URL: set it to http"),
        ("GPU_TRAIN_SSH_CONFIG", "maybe", "GPU_TRAIN_SSH_CONFIG='maybe': set it to include or no"),
    ],
)
def test_a_bad_value_names_the_variable_and_the_fix(variable: str, value: str, words: str) -> None:
    with pytest.raises(SettingError) as e:
        Environment.from_os({variable: value})
    assert str(e.value).startswith(words) and e.value.status == 2


def test_a_bad_value_stops_the_command_with_its_message(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_TRAIN_SSH_CONFIG": "sometimes"}
    out = subprocess.run(
        [sys.executable, "-c", "from remote.cli import main; main()", "gpus", "T4"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "GPU_TRAIN_SSH_CONFIG='sometimes': set it to include or no" in out.stderr
    assert "Traceback" not in out.stderr and not out.stdout


def test_the_settings_pass_to_a_process_of_ours(tmp_path: Path) -> None:
    env = Environment.from_os(
        {"GPU_TRAIN_STACKS_DIR": str(tmp_path), "GPU_TRAIN_SSH_CONFIG": "include", "GPU_TRAIN_COMPUTE_ENDPOINT": "http://127.0.0.1:9"}
    )
    assert env.exported() == {
        "GPU_TRAIN_STACKS_DIR": str(tmp_path),
        "GPU_TRAIN_SSH_CONFIG": "1",
        "GPU_TRAIN_COMPUTE_ENDPOINT": "http://127.0.0.1:9",
    }
    assert Environment.from_os(env.exported()) == env.replace(cwd=Path.cwd())


def test_a_task_gets_the_environment_its_entry_point_built(tmp_path: Path) -> None:
    from invoke import Config, Context

    c = Context(Config())
    first = Environment.of(c)  # `fab`: built at the first task, kept for the next
    assert Environment.of(c) == first
    given = Environment(stack="lab", cwd=tmp_path)
    c = Context(Config(overrides={CONFIG_KEY: given}))  # `gpu-train`: the program put it in the config
    assert Environment.of(c) == given


def test_stacks_dir_reaches_the_tasks_not_the_process(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from remote.cli import program

    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "Pulumi.mine.yaml").write_text("config:\n  gpu-train:target: ssh\n  gpu-train:hosts: [me@h:22]\n")
    (tmp_path / "p" / "stacks").mkdir(parents=True)
    before = os.environ.get("GPU_TRAIN_STACKS_DIR")
    program(Environment(cwd=tmp_path / "p")).run(["gpu-train", "--stacks-dir", str(extra), "stack"], exit=False)
    assert os.environ.get("GPU_TRAIN_STACKS_DIR") == before
    assert f"{extra / 'Pulumi.mine.yaml'}" in capsys.readouterr().out  # listed: the tasks' Environment has it


def test_the_hosts_variable_names_are_the_contracts() -> None:
    assert recovery.METADATA_URL_ENV == contract.METADATA_URL_ENV
    with pytest.raises(ValueError, match=r"GPU_TRAIN_OP_WAIT_S='soon' is not a number: set it to one \(e\.g\. 150\)"):
        recovery_call.settings_from_env({recovery.OP_WAIT_S_ENV: "soon"})
    assert recovery_call.settings_from_env({})["opWaitS"] == 150


@pytest.mark.parametrize(
    ("debug", "said"), [("", "error: boom (ValueError; GPU_TRAIN_DEBUG=1 shows where)"), ("1", "Traceback (most recent call last)")]
)
def test_debug_shows_where_an_unexpected_error_came_from(debug: str, said: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_TRAIN_DEBUG": debug}
    out = subprocess.run(
        [sys.executable, "-c", "from remote import errors; errors.install(); raise ValueError('boom')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and said in out.stderr and ("Traceback" in out.stderr) == bool(debug)


def test_no_terminal_no_question() -> None:
    from remote.ssh import alias

    assert alias.terminal_ask(Environment(stdin_isatty=False)) is None
    assert alias.terminal_ask(Environment(stdin_isatty=True)) is not None


def test_a_missing_stack_names_the_command_the_user_runs(tmp_path: Path) -> None:
    from gpu_train.stack.config import ConfigError

    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.lab.yaml").write_text("config: {}\n")
    env = Environment(cli="fab", cwd=tmp_path)
    assert env.stack_file("lab") == tmp_path / "stacks" / "Pulumi.lab.yaml"
    with pytest.raises(ConfigError, match=r"did you mean lab( or \w+)?\? `fab init --stack lb` writes one into"):
        env.stack_file("lb")


def test_a_projects_records_are_the_users_and_a_copy_starts_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A project copied without git (a ZIP, `cp -r`, a synced drive) brought its .gpu-train/ along (a VM's
    cached address, a pinned host key): `train --env SECRET` sent the code and the secret there."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "p" / "stacks").mkdir(parents=True)
    (tmp_path / "p" / ".gpu-train" / "lab").mkdir(parents=True)
    (tmp_path / "p" / ".gpu-train" / "lab" / "known_hosts").write_text("planted\n")
    shutil.copytree(tmp_path / "p", tmp_path / "copy")
    mine, copy = (Environment.from_os({}, cwd=tmp_path / d).state_home for d in ("p", "copy"))
    assert mine.is_relative_to(tmp_path / "state" / "gpu-train" / "projects") and mine.name.startswith("p-")
    assert copy != mine and copy.is_relative_to(tmp_path / "state") and copy.name.startswith("copy-")
    assert Environment.from_os({}, cwd=tmp_path / "p" / "stacks").state_home == mine  # the project's, from anywhere in it
    assert Environment.from_os({"GPU_TRAIN_HOME": str(tmp_path / "h")}, cwd=tmp_path / "copy").state_home == tmp_path / "h"
