"""Pure decisions on the laptop side: run ids, job specs, rsync command lines, targets."""

from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from agent import bundle
from gpu_train import jobs
from gpu_train.catalog.loader import load_catalog
from gpu_train.contract import JobSpec, is_run_id
from gpu_train.environment import Environment
from gpu_train.stack.config import SshHost, parse
from remote.ssh import target
from remote.tasks.render import render_status
from remote.transfer import sync
from tests.conftest import gcp_raw

CATALOG = load_catalog()


@pytest.mark.parametrize(
    ("name", "script", "command", "base"),
    [
        (None, "train.py", None, "train"),
        (None, "src/my-model.v2.py", None, "my_model_v2"),
        (None, None, "bash run.sh", "job"),
        ("exp_1", "train.py", None, "exp_1"),
        (None, "3d.py", None, "job_3d"),
        ("my-exp-2", "train.py", None, "my_exp_2"),  # --name accepts hyphens: run ids keep the AI Platform rule
        (None, "x" * 200 + ".py", None, "x" * 112),
    ],
)
def test_base_name(name, script, command, base) -> None:
    assert jobs.base_name(name, script, command) == base


@pytest.mark.parametrize("name", ["9lives", "-dash", "", "a b", "é"])
def test_base_name_rejects(name: str) -> None:
    with pytest.raises(jobs.JobError, match="--name"):
        jobs.base_name(name, "train.py", None)


def test_run_id_follows_the_ai_platform_rule() -> None:
    rid = jobs.run_id("x" * 112, datetime(2026, 11, 21, 9, 5, 7))
    assert rid.endswith("_20261121_090507") and len(rid) == 128 and is_run_id(rid)


@pytest.mark.parametrize(
    ("pairs", "environ", "files", "env"),
    [
        ([], {}, {}, {}),
        (["A=1", "B=x=y", "C="], {}, {}, {"A": "1", "B": "x=y", "C": ""}),
        (["TOKEN"], {"TOKEN": "s3cr=t", "OTHER": "no"}, {}, {"TOKEN": "s3cr=t"}),  # NAME: the laptop's value
        (["TOKEN", "A=2"], {"TOKEN": ""}, {"f": "A=1\nB=1"}, {"A": "2", "B": "1", "TOKEN": ""}),  # --env wins
        ([], {}, {"a": "A=1\nB=1", "b": "B=2"}, {"A": "1", "B": "2"}),  # a later file wins
    ],
)
def test_parse_env(pairs, environ, files, env) -> None:
    assert jobs.parse_env(pairs, environ, files) == env


@pytest.mark.parametrize(
    ("text", "env"),
    [
        ("", {}),
        ("# a comment\n\n  \nA=1\n", {"A": "1"}),
        ("export A=1\nB = two words \n", {"A": "1", "B": "two words"}),
        ("A=x # a comment\nB=x#not-a-comment\n", {"A": "x", "B": "x#not-a-comment"}),
        ("A='single $X \\n # kept'\n", {"A": "single $X \\n # kept"}),
        ('A="dq \\"q\\" \\\\ \\n end"\n', {"A": 'dq "q" \\ \n end'}),
        ("A=\nB=''\nC=\"\"\n", {"A": "", "B": "", "C": ""}),
        ("A=1\r\nB=2\r\n", {"A": "1", "B": "2"}),  # a file saved on Windows
        ("A=1\nA=2\n", {"A": "2"}),
        ('A="two\nlines"\nB=${A}\n', {"A": "two\nlines", "B": "${A}"}),  # a quoted value spans lines; no expansion
    ],
)
def test_parse_env_file(text: str, env: dict) -> None:
    assert jobs.parse_env_file(text, "f.env") == env


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("A=1\nnot a pair\n", "--env-file f.env, line 2: expected NAME=VALUE"),
        ("1A=1", "line 1: '1A' is not a variable name"),
        ("A='open\n", "line 1: expected NAME=VALUE"),
        ("A=1\nB\n", "line 2: expected NAME=VALUE"),
    ],
)
def test_parse_env_file_rejects(text: str, words: str) -> None:
    with pytest.raises(jobs.JobError, match=re.escape(words)):
        jobs.parse_env_file(text, "f.env")


def test_job_spec(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t.py").write_text("")
    spec = jobs.job_spec(
        run="t_1",
        base="t",
        script=str(tmp_path / "sub" / "t.py"),
        command=None,
        args="--lr 0.1 --name 'a b'",
        env=["K=V"],
        python=None,
        expect_gpus=2,
        code_dir=tmp_path,
    )
    assert spec.script == "sub/t.py" and spec.args == ("--lr", "0.1", "--name", "a b")
    assert spec.to_json()["expectGpus"] == 2 and spec.env == {"K": "V"}
    with pytest.raises(jobs.JobError, match="inside --dir"):
        jobs.job_spec(run="t", base="t", script="/etc/passwd", command=None, args="", env=[], python=None, expect_gpus=0, code_dir=tmp_path)
    assert not spec.pass_job_dir and spec.to_json()["resumeArgs"] == [] and spec.resume_if is None
    spec = jobs.job_spec(
        run="t_1",
        base="t",
        script="sub/t.py",
        command=None,
        args="",
        env=["T"],
        python=None,
        expect_gpus=0,
        code_dir=tmp_path,
        environ={"T": "v"},
        pass_job_dir=True,
        resume_args="--init_from=resume --note 'a b'",
        resume_if="out/ckpt.pt",
    )
    assert JobSpec.from_json(spec.to_json()) == spec  # what the host keeps in spec.json, read back
    assert (spec.pass_job_dir, spec.resume_args, spec.resume_if) == (True, ("--init_from=resume", "--note", "a b"), "out/ckpt.pt")
    for kwargs, words in [
        ({"command": "x", "script": None, "pass_job_dir": True}, "--pass-job-dir goes with --script"),
        ({"resume_if": "out/ckpt.pt"}, "give both"),
        ({"resume_args": "'open"}, '--resume-args "\'open": no closing quotation'),
    ]:
        with pytest.raises(jobs.JobError, match=re.escape(words)):
            jobs.job_spec(
                **{
                    "run": "t_1",
                    "base": "t",
                    "script": "sub/t.py",
                    "command": None,
                    "args": "",
                    "env": [],
                    "python": None,
                    "expect_gpus": 0,
                    "code_dir": tmp_path,
                    **kwargs,
                }
            )


def test_agent_command_carries_the_agent_inline() -> None:
    cmd = bundle.agent_command("~/gpu-train", "status", cli="gpu-train")
    assert cmd.startswith("p=/usr/bin/python3; ") and " -S -c " in cmd and cmd.endswith("--root '~/gpu-train' status")
    # sshd runs it as one argument of `sh -c`, and Linux takes at most MAX_ARG_STRLEN (32 pages: 128 KiB)
    # in one argument; 96 KiB leaves a quarter of that spare.
    assert len(cmd) < 96 * 1024


def lab_target(**kw) -> target.Target:
    cfg = parse({"gpu-train:target": "ssh", "gpu-train:hosts": ["me@127.0.0.2:2222"], "gpu-train:sshKey": "/k/id", **kw}, "lab", CATALOG)
    return target.target_from(cfg, None, Path("/state"))


def test_push_command() -> None:
    t = lab_target()
    cmd = sync.push_command(t, t.host, Path("/code"), "run_1", "run", Path("/tmp/ex"), git_mode=True)
    assert cmd[:3] == ["rsync", "-a", "--delete"]
    rsync_path = next(a for a in cmd if a.startswith("--rsync-path="))
    assert rsync_path.endswith(" && mkdir -p .gpu-train/staging && rsync") and "secure_root" in rsync_path  # the default root
    assert "--link-dest=../../code/run.last" in cmd and "--exclude-from=/tmp/ex" in cmd
    assert "--exclude=/.git/" in cmd and "--filter=:- .gputrainignore" in cmd and "--filter=:- .gitignore" not in cmd
    assert cmd[-2:] == ["/code/", "me@127.0.0.2:.gpu-train/staging/run_1/"]
    ssh = cmd[cmd.index("-e") + 1]
    for opt in ("-p 2222", "-i /k/id", "StrictHostKeyChecking=yes", "UserKnownHostsFile=/state/lab/known_hosts", "BatchMode=yes"):
        assert opt in ssh
    plain = sync.push_command(t, t.host, Path("/code"), "run_1", "run", None, git_mode=False)
    assert "--filter=:- .gitignore" in plain and not any(a.startswith("--exclude-from") for a in plain)


def test_remote_path_ipv6() -> None:
    assert sync.remote_path(SshHost("u", "::1", 22), "x/") == "u@[::1]:x/"


def test_listed_bytes() -> None:
    listing = (
        "drwxr-xr-x          4,096 2026/11/21 23:00:00 .\n-rw-r--r--          1,234 2026/11/21 23:00:00 a.py\n"
        "-rw-r--r--     10,000,000 2026/11/21 23:00:00 b.bin\nlrwxrwxrwx             12 2026/11/21 23:00:00 l -> a\n"
    )
    assert sync.listed_bytes(listing) == (2, 10_001_234)


def test_gcp_target_from_outputs() -> None:
    cfg = parse(gcp_raw(sshPublicKey="~/.ssh/work.pub"), "t4", CATALOG)
    outputs = {"externalIp": "203.0.113.10", "sshUser": "trainer", "gpuCount": 1, "hourlyCostUsd": 0.28}
    t = target.target_from(cfg, outputs, Path("/state"))
    assert t.hosts == (SshHost("trainer", "203.0.113.10", 22, keys=(t.key_file,)),) and t.is_gcp and t.expect_gpus == 1
    assert t.key_file.endswith("/.ssh/work") and t.known_hosts == Path("/state/t4/known_hosts") and not t.pinned
    assert t.hourly_cost_usd == 0.28 and t.rsync_root() == "gpu-train"


def test_ssh_target_waits_for_no_gpus() -> None:
    t = lab_target(**{"gpu-train:knownHosts": "/etc/kh"})
    assert t.expect_gpus == 0 and t.pinned and t.known_hosts == Path("/etc/kh") and not t.is_gcp


def test_render_status() -> None:
    t = target.target_from(parse(gcp_raw(), "t4", CATALOG), {"externalIp": "203.0.113.10", "gpuCount": 1, "hourlyCostUsd": 0.5}, Path("/s"))
    doc = {
        "host": "vm",
        "root": "/home/trainer/gpu-train",
        "uptimeS": 7200,
        "gpus": [{"index": 0, "name": "Tesla T4", "utilization": 87.0, "memoryUsedMiB": 9000, "memoryTotalMiB": 15360}],
        "runs": [
            {"id": "train_20260101_000000", "state": "failed", "exitCode": 3, "durationS": 3725, "lastLine": "ValueError: boom"},
            {
                "id": "pip_20260101_000000",
                "state": "failed",
                "exitCode": 1,
                "durationS": 2,
                "lastLine": "",
                "reason": "pip install -r requirements.txt failed (exit 1): no such file",
            },
            {"id": "t_20260101_000000", "state": "running", "exitCode": None, "durationS": 5, "resumes": 2},
            {
                "id": "loop_20260101_000000",
                "state": "failed",
                "exitCode": None,
                "durationS": 9,
                "resumes": 2,
                "lastLine": "noise from a login shell",
                "reason": "interrupted 3 times; maxResumes = 2",
            },
        ],
    }
    text = render_status(doc, t)
    assert "VM up 2.0 h, about $1.00 so far" in text and "GPU 0 Tesla T4: 87% busy, 9000/15360 MiB" in text
    table = text.splitlines()[-5:]
    assert table[0].split() == ["RUN", "STATE", "EXIT", "DURATION", "LAST", "LINE"]
    assert table[1].split() == ["train_20260101_000000", "failed", "3", "1h02m", "ValueError:", "boom"]
    assert table[2].endswith("pip install -r requirements.txt failed (exit 1): no such file")  # no line of its own
    assert table[3].split()[:5] == ["t_20260101_000000", "running", "[resumed", "2x]", "-"]
    assert table[1].index("failed") == table[0].index("STATE")  # columns line up
    assert table[4].endswith("interrupted 3 times; maxResumes = 2")  # gpu-train ended it: why, not the last line
    ns = int(datetime(2026, 1, 1, 12, 30).timestamp() * 1e9)
    doc["runs"][0] |= {
        "jobSummary": {"files": 1, "bytes": 1024, "newestNs": 1},
        "workdirSummary": {"files": 2, "bytes": 2048, "newestNs": ns},
    }
    doc["runs"][1] |= {"jobSummary": {"files": 0, "bytes": 0, "newestNs": 0}, "workdirSummary": {"files": 0, "bytes": 0, "newestNs": 0}}
    summed = render_status(doc, t).splitlines()[-5:]
    assert summed[0].split()[:6] == ["RUN", "STATE", "EXIT", "DURATION", "OUTPUTS", "LAST"]
    assert "3 files 3.0 KiB (2 in workdir), newest 01-01 12:30  ValueError: boom" in summed[1]
    assert "0 files 0 B " in summed[2] and summed[3].split()[6] == "-"  # a run the host did not sum up


@pytest.fixture
def stand_in_pulumi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The Pulumi CLI cannot run here: a stand-in executable answers at the process boundary."""
    monkeypatch.setenv("PATH", f"{Path(__file__).parents[1] / 'stand_in'}:{os.environ['PATH']}")
    monkeypatch.setenv("PULUMI_STAND_IN_DIR", str(tmp_path))
    (tmp_path / "outputs.json").write_text('{"externalIp": "203.0.113.10", "sshUser": "trainer", "gpuCount": 1}')
    return tmp_path


def test_stack_outputs_are_cached_and_refreshed(stand_in_pulumi: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "t4"
    assert target.stack_outputs("t4", cache)["externalIp"] == "203.0.113.10"
    assert target.stack_outputs("t4", cache)["externalIp"] == "203.0.113.10"
    calls = (stand_in_pulumi / "calls").read_text().splitlines()
    assert calls == ["stack output --json --show-secrets --stack t4"]  # the second came from the cache
    (stand_in_pulumi / "outputs.json").write_text('{"externalIp": "198.51.100.4", "gpuCount": 1}')
    assert target.stack_outputs("t4", cache, refresh=True)["externalIp"] == "198.51.100.4"
    assert len((stand_in_pulumi / "calls").read_text().splitlines()) == 2


def test_stack_outputs_errors(stand_in_pulumi: Path, tmp_path: Path) -> None:
    (stand_in_pulumi / "fail").write_text("error: no stack named 't4' found")
    with pytest.raises(target.ConfigError, match="no stack named 't4' found"):
        target.stack_outputs("t4", tmp_path / "c")
    (stand_in_pulumi / "fail").unlink()
    (stand_in_pulumi / "outputs.json").write_text("{}")
    with pytest.raises(target.ConfigError, match="has no VM yet"):
        target.stack_outputs("t4", tmp_path / "c")


def test_selected_stack(stand_in_pulumi: Path, tmp_path: Path) -> None:
    env = Environment(cwd=tmp_path)
    assert target.select_stack(env, "given") == "given"
    assert target.select_stack(Environment.from_os({"GPU_TRAIN_STACK": "from-env"}, cwd=tmp_path), None) == "from-env"
    assert target.select_stack(env, None) == "selected-stack"


def _run(rid: str, state: str, created: float, nodes: list[str] | None = None) -> dict:
    return {
        "id": rid,
        "state": state,
        "created": created,
        **({"nodes": [{"node": i, "state": s} for i, s in enumerate(nodes)]} if nodes else {}),
    }


@pytest.mark.parametrize(
    ("runs", "chosen"),
    [
        ([_run("a", "interrupted", 1), _run("b", "succeeded", 2)], "a"),  # never the newer, finished one
        ([_run("a", "interrupted", 1), _run("b", "interrupted", 3), _run("c", "failed", 4)], "b"),
        ([_run("b", "interrupted", 3), _run("a", "interrupted", 1)], "b"),  # by creation, not by listing order
        ([_run("a", "failed", 1, ["interrupted", "failed"]), _run("b", "stopped", 2)], "a"),  # a node was preempted
    ],
)
def test_resume_takes_the_newest_interrupted_run(runs: list[dict], chosen: str) -> None:
    assert jobs.resumable(runs, "gpu-train resume") == chosen


@pytest.mark.parametrize(
    ("runs", "words"),
    [
        ([], "no runs on this host yet"),
        (
            [_run("a", "running", 1), _run("b", "succeeded", 2)],
            "no interrupted run to resume (the newest, b, is succeeded); to restart it anyway: gpu-train resume --run b",
        ),
    ],
)
def test_resume_without_an_interrupted_run_says_so(runs: list[dict], words: str) -> None:
    with pytest.raises(jobs.JobError, match=re.escape(words)):
        jobs.resumable(runs, "gpu-train resume")


LOCK = 'version = 1\n\n[[package]]\nname = "torch"\nversion = "2.13.0+cpu"\n'
PYPROJECT = '[project]\nname = "m"\ndependencies = [\n    "torch==2.13.0+cpu",\n    "transformers",\n]\n'


@pytest.mark.parametrize(
    ("files", "installs"),
    [
        ({"requirements.txt": "torch==2.4\n"}, True),
        ({"requirements.txt": "numpy\ntorch-geometric\n"}, False),  # another package whose name starts so
        ({"requirements.txt": "numpy\n", "pyproject.toml": PYPROJECT}, False),  # requirements.txt alone is installed
        ({"pyproject.toml": PYPROJECT, "uv.lock": LOCK}, True),  # uv.lock's pins, as the host installs them
        ({"pyproject.toml": PYPROJECT, "uv.lock": 'version = 1\n[[package]]\nname = "numpy"\n'}, False),
        ({"pyproject.toml": PYPROJECT}, True),  # [project] dependencies
        ({"pyproject.toml": '[project]\ndependencies = ["torch>=2", "numpy"]\n'}, True),
        ({"pyproject.toml": '[project]\ndependencies = ["torchvision"]\n'}, False),
        ({"uv.lock": LOCK}, False),  # no pyproject.toml: the host installs nothing
        ({}, False),
    ],
)
def test_installs_torch_reads_what_the_host_installs(files: dict[str, str], installs: bool) -> None:
    assert jobs.installs_torch(files) is installs


def test_a_uv_project_that_locks_torch_needs_no_torch_on_the_host(tmp_path: Path) -> None:
    """A pyproject.toml + uv.lock project (no requirements.txt) whose lock pins torch: the host installs it, so
    train must not refuse for the host Python's lack of torch (it did: only requirements.txt was read)."""
    (tmp_path / "train.py").write_text("import torch\n")
    assert jobs.needs_torch(tmp_path, "train.py", "none")
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "uv.lock").write_text(LOCK)
    assert not jobs.needs_torch(tmp_path, "train.py", "none")
    assert not jobs.needs_torch(tmp_path, "train.py", "torchrun")


@pytest.mark.parametrize(
    ("resume_if", "refused"), [("$JOB_DIR/ckpt.pt", False), ("${JOB_DIR}/c*.pt", False), ("$OUT/ckpt.pt", True), ("out/$X", True)]
)
def test_resume_if_expands_job_dir_alone(tmp_path: Path, resume_if: str, refused: bool) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    spec: dict[str, Any] = dict(
        run="r", base="r", command=None, args="", env=[], python=None, expect_gpus=0, code_dir=tmp_path, resume_args="--resume"
    )
    if refused:
        with pytest.raises(
            jobs.JobError, match=re.escape(f"--resume-if {resume_if}: no variable is expanded there but a leading $JOB_DIR/")
        ):
            jobs.job_spec(script="train.py", resume_if=resume_if, **spec)
    else:
        assert jobs.job_spec(script="train.py", resume_if=resume_if, **spec).resume_if == resume_if
