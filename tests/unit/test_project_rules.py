"""The pure parts of working from a researcher's project, as tables: the stack search path, "did you
mean", the hosts of an ssh_config dump, what the code sync leaves out, and the starter stacks.

The same behaviour end to end, against real sshds, is tests/unit/test_project.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

DUMP = "user me\nhostname 10.1.2.3\nport 2200\nidentityfile ~/.ssh/id_ed25519\nidentityfile /k/lab\nproxyjump gw\n"


def test_ssh_dump_and_jumps() -> None:
    from remote.ssh import config as sshconfig

    dump = sshconfig.parse_dump(DUMP)
    assert dump["identityfile"] == ["~/.ssh/id_ed25519", "/k/lab"] and dump["proxyjump"] == ["gw"]
    host = sshconfig.from_dump(dump, "labbox", ("/k/lab",), ())
    assert (host.user, host.host, host.port, host.spec, host.keys) == ("me", "10.1.2.3", 2200, "labbox", ("/k/lab",))
    assert sshconfig.identity_files(dump, "~/mine") == (os.path.expanduser("~/mine"),)
    for value, hops in (("none", []), ("", []), ("a,b@c:22", ["a", "b@c:22"]), ("ssh://u@h:2", ["u@h:2"])):
        assert sshconfig.jump_specs(value) == hops


@pytest.mark.parametrize(
    ("user", "hostname", "port", "words"),
    [
        ("-oProxyCommand=touch /tmp/x", "10.1.2.3", "22", "starts with '-'"),
        ("me", "-oProxyCommand=sh", "22", "starts with '-'"),
        ("me x", "10.1.2.3", "22", "not a login name"),
        ("me", "host name; rm", "22", "whitespace"),
    ],
)
def test_an_ssh_config_is_checked_like_a_stack_file(user: str, hostname: str, port: str, words: str) -> None:
    # User and HostName go before the destination on ssh and rsync command lines: an ssh_config
    # (sshConfig may name any file, a shared one too) must not turn them into options.
    from remote.ssh import config as sshconfig

    dump = {"user": [user], "hostname": [hostname], "port": [port]}
    with pytest.raises(sshconfig.SshConfigError, match=words):
        sshconfig.from_dump(dump, "labbox", (), ())


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        (b"Host lab\n  HostName 10.0.0.1\n  User me\n  Port 2200\n  IdentityFile ~/.ssh/lab\n  ProxyJump gw\n", []),
        (b"Host lab\n  # ProxyCommand in a comment\n", []),
        (b'Match exec "touch /tmp/x; false"\n', ["Match exec"]),
        (b'Match host lab !exec "touch /tmp/x"\n', ["Match exec"]),
        (b'  "Match" "exec" "touch /tmp/x"\n', ["Match exec"]),  # OpenSSH takes the quoted keywords
        (b"MATCH EXEC=true\n", ["Match exec"]),
        (b"Match\texec\ttrue\n", ["Match exec"]),
        (b"Match all\n  ProxyCommand=nc %h %p\n", ["proxycommand"]),
        (b"Host *\n  LocalCommand touch /tmp/x\n  PermitLocalCommand yes\n", ["localcommand", "permitlocalcommand"]),
        (b"Host *\n  KnownHostsCommand /bin/sh -c x\n", ["knownhostscommand"]),
        (b"Include /tmp/other\n", ["include"]),
        (b"Host *\n  PKCS11Provider /tmp/evil.so\n  SecurityKeyProvider /tmp/evil.so\n", ["pkcs11provider", "securitykeyprovider"]),
        (b"Host *\n  ProxyUseFdpass yes\n", ["proxyusefdpass"]),
        (b"Host *\r\n  Proxy\\Command nc\r\n", ["proxycommand"]),  # a backslash OpenSSH would drop
        (b"Host a\0junk\nMatch exec x\n", ["Match exec"]),  # a NUL ends a line, not the file
    ],
)
def test_an_ssh_config_that_runs_commands_is_refused(text: bytes, refused: list[str]) -> None:
    # A project's (or a shared) ssh_config is read with `ssh -G -F FILE`, which runs Match exec as it
    # reads: anything that runs a command is refused in any file but the user's own.
    from remote.ssh import config as sshconfig

    found = sshconfig.config_problems(text)
    assert [p.split(": ")[1].split(" ")[0] if "Match exec" not in p else "Match exec" for p in found] == refused, found


@pytest.mark.parametrize(
    ("word", "choices", "expected"),
    [
        ("trian", ["train", "status", "stop"], ["train"]),
        ("sta", ["train", "status", "stop"], ["status"]),
        ("t5", ["t4", "l4", "a100"], ["t4"]),
        ("zzz", ["train"], []),
    ],
)
def test_did_you_mean(word: str, choices: list[str], expected: list[str]) -> None:
    from gpu_train.stack.project import did_you_mean

    assert did_you_mean(word, choices)[: len(expected) or None] == expected


def test_stack_search_path(tmp_path: Path) -> None:
    from gpu_train.stack import project

    mine, extra = tmp_path / "p" / "stacks", tmp_path / "extra"
    for d in (mine, extra):
        d.mkdir(parents=True)
    (extra / "Pulumi.lab.yaml").write_text("config: {}\n")
    dirs = project.stack_dirs(tmp_path / "p", extra)
    assert dirs == [mine, extra, project.EXAMPLE_STACKS]
    assert project.stack_path("lab", dirs) == extra / "Pulumi.lab.yaml"
    (mine / "Pulumi.lab.yaml").write_text("config: {}\n")
    assert project.stack_path("lab", dirs) == mine / "Pulumi.lab.yaml"  # the project's own first
    assert "t4-spot" in project.stack_names(dirs) and project.stack_path("nope", dirs) is None
    assert project.project_root(mine) == tmp_path / "p"


def test_left_out_and_always_excluded(tmp_path: Path) -> None:
    from remote.transfer import ignores

    assert ignores.always_excluded(tmp_path, [(tmp_path / "runs", "fetched results"), (Path("/elsewhere"), None)]) == [
        ("/runs/", "fetched results")
    ]
    items = [ignores.LeftOut("data/", 51 * 1024 * 1024, "ignored by .gitignore"), ignores.LeftOut("runs/", 10, "fetched results")]
    text = ignores.left_out_summary(items)
    assert text.startswith("left out: data/ 51.0 MiB, ignored by .gitignore; runs/ 10 B, fetched results.")
    assert "To send data/: gpu-train push data (the job finds it in $DATA_DIR/data, and as data/" in text
    assert ignores.left_out_summary([]) == ""
    files = ignores.left_out_summary([ignores.LeftOut("big.bin", 9, "ignored by .gitignore")], "fab")
    assert "fab push DIR (the job finds it in $DATA_DIR/DIR)" in files
    nested = ignores.left_out_summary([ignores.LeftOut("sets/imagenet/", 9, "ignored by .gitignore")], "fab")
    assert "fab push sets/imagenet (the job finds it in $DATA_DIR/sets/imagenet, and as sets/imagenet/ in its" in nested
    # a gitignored file in a folder (`data/**/*.bin`, as nanoGPT's prepare scripts make): push its folder
    bins = ignores.left_out_summary(
        [ignores.LeftOut("runs/", 99, "fetched results"), ignores.LeftOut("data/mydata/train.bin", 9, "ignored by .gitignore")]
    )
    assert "To send data/mydata/: gpu-train push data/mydata (the job finds it in $DATA_DIR/data/mydata, and as" in bins
    top = ignores.left_out_summary([ignores.LeftOut("cache.bin", 9, "ignored by .gitignore")])
    assert "gpu-train push DIR (the job finds it in $DATA_DIR/DIR)" in top
    # a monorepo's example trained from the root: `push` names the path from there, the job's paths stay its own
    sub = ignores.left_out_summary([ignores.LeftOut("data/", 9, "ignored by .gitignore")], where="examples/fit")
    assert sub.startswith("left out in examples/fit: data/ 9 B")
    assert "To send data/: gpu-train push examples/fit/data (the job finds it in $DATA_DIR/data, and as data/ in its" in sub


def test_a_pushed_folder_left_out_is_said_as_pushed_not_as_to_push() -> None:
    from remote.transfer import ignores
    from remote.transfer.ignores import LeftOut, Pushed

    data, runs = LeftOut("data/", 3 << 20, "ignored by .gitignore"), LeftOut("runs/", 10, "fetched results")
    at = "to lab at 2026-11-28 11:02"
    cases = [  # (pushed, words in the line, words not in it)
        ({}, ["To send data/: gpu-train push data"], ["was pushed"]),
        (
            {"data": Pushed(at)},
            ["data/ was pushed to lab at 2026-11-28 11:02 and is unchanged since: the job finds it in $DATA_DIR/data."],
            ["To send", "push data"],
        ),
        (
            {"data": Pushed(at, "1 file(s), 3.0 MiB then; 2, 3.5 MiB now")},
            ["data/ changed since it was pushed to lab at 2026-11-28 11:02 (1 file(s), 3.0 MiB then; 2, 3.5 MiB now): "
             "`gpu-train push data` sends the changes."],
            ["To send"],
        ),
        ({"data": Pushed(at, None)}, ["(too many files to look for changes; `gpu-train push data` sends any)"], ["To send"]),
        ({"other": Pushed(at)}, ["To send data/: gpu-train push data"], ["was pushed"]),  # another folder's push
    ]  # fmt: skip
    for pushed, said, unsaid in cases:
        text = ignores.left_out_summary([data, runs], pushed=pushed)
        assert text.startswith("left out: data/ 3.0 MiB, ignored by .gitignore; runs/ 10 B, fetched results."), text
        assert all(w in text for w in said) and not any(w in text for w in unsaid), (pushed, text)
    # one folder pushed, another not: the pushed one said as such, the other one's hint as before
    both = ignores.left_out_summary([data, LeftOut("sets/", 9, "ignored by .gitignore")], pushed={"data": Pushed(at)})
    assert "data/ was pushed" in both and both.endswith("To send sets/: gpu-train push sets (the job finds it in "
                                                          "$DATA_DIR/sets, and as sets/ in its working directory)")  # fmt: skip
    sub = ignores.left_out_summary([data], where="examples/fit", pushed={"data": Pushed(at, "a")})
    assert "`gpu-train push examples/fit/data` sends the changes" in sub


@pytest.mark.parametrize(
    ("then", "now", "change"),
    [
        ({"files": 1, "bytes": 10, "newestNs": 5}, {"files": 1, "bytes": 10, "newestNs": 5}, ""),
        ({"files": 1, "bytes": 10, "newestNs": 5}, {"files": 1, "bytes": 10, "newestNs": 6}, "the same files and bytes, one modified"),
        ({"files": 1, "bytes": 3 << 20, "newestNs": 5}, {"files": 2, "bytes": 4 << 20, "newestNs": 6},
         "1 file(s), 3.0 MiB then; 2, 4.0 MiB now"),
    ],
)  # fmt: skip
def test_a_pushed_folders_change(then: dict, now: dict, change: str) -> None:
    from remote.transfer.ignores import summary_change

    assert summary_change(then, now) == change


def test_a_notice_said_before_is_not_said_again_until_it_changes(tmp_path: Path) -> None:
    from remote.tasks.localstate import SaidBefore

    said = SaidBefore(tmp_path)
    assert said.first_time("left out /p", "left out: data/ 9 B") and not said.first_time("left out /p", "left out: data/ 9 B")
    assert said.first_time("left out /q", "left out: data/ 9 B")  # another folder's
    assert said.first_time("left out /p", "left out: data/ 10 B") and not SaidBefore(tmp_path).first_time(
        "left out /p", "left out: data/ 10 B"
    )


def test_suggest_and_starter_stacks() -> None:
    import yaml
    from invoke import ParseError

    from gpu_train.catalog.loader import load_catalog
    from gpu_train.stack import config
    from remote import cli
    from remote.tasks import starter

    assert cli.suggest(ParseError("No idea what 'fetc' is!"), ["fetch", "train"], []) == "No idea what 'fetc' is! Did you mean fetch?"
    assert "Did you mean --follow?" in cli.suggest(ParseError("No idea what '--folow' is!"), [], ["--follow", "--run"])
    cfg = config.parse(yaml.safe_load(starter.ssh_stack("me@box:2222", None))["config"], "lab", load_catalog())
    assert cfg.hosts[0] == config.SshHost("me", "box", 2222) and cfg.ssh_key is None
    t4 = starter.starter_shape(load_catalog(), "T4", "us-central1-a", False, True)
    raw = yaml.safe_load(starter.gcp_stack("proj-1", t4, "203.0.113.7/32"))
    assert config.parse(raw["config"], "gcp", load_catalog()).spot
    assert starter.ignore_lines("runs\n/.gpu-train/\n") == [] and starter.ignore_lines("data/\n") == ["runs/", ".gpu-train/"]


def starter_gpus() -> list[str]:
    from gpu_train.catalog.loader import load_catalog

    return sorted(load_catalog().accelerators)


@pytest.mark.parametrize("gpu", starter_gpus())
@pytest.mark.parametrize("spot", [True, False])
def test_init_writes_a_stack_plan_accepts_for_every_gpu_of_the_catalog(gpu: str, spot: bool) -> None:
    """`init --gcp-project P --gpu nvidia-l4` wrote gpuType/gpuCount, which plan refuses at once for every GPU that
    comes with its machine type (G2, A2, A3, A4, G4); the zone must offer it, and the big ones are had spot or
    Flex-start. A GPU had only through a reservation is refused, saying what to write instead."""
    import yaml

    from gpu_train.catalog.loader import load_catalog
    from gpu_train.errors import UsageError
    from gpu_train.gcp import validate
    from remote.tasks import starter

    catalog = load_catalog()
    try:
        shape = starter.starter_shape(catalog, gpu, "us-central1-a", False, spot)
    except UsageError as e:
        assert "reservation" in str(e) and "gpu-train:reservation NAME" in str(e)
        assert catalog.ways(catalog.shapes_with(gpu)[0].name) == ("reservation",)
        return
    raw = yaml.safe_load(starter.gcp_stack("my-lab-1234", shape, "198.51.100.7/32"))["config"]
    cfg, problems = validate.check(raw, "gcp", catalog)  # ConfigError on any error, as `plan` stops
    assert cfg.zone in catalog.zones_for(gpu, catalog.parse_machine_type(cfg.machine_type))
    assert all(p.severity == "warning" for p in problems)
    assert [p.key for p in problems] in ([], ["sshSourceRanges"], ["gpuType"], ["gpuType", "sshSourceRanges"])  # T4/P4: deprecated


def test_init_names_the_projects_own_script_and_real_docs(tmp_path: Path) -> None:
    from remote.tasks import starter

    assert starter.likely_script(tmp_path) == "SCRIPT.py"
    (tmp_path / "model.py").write_text("")
    (tmp_path / "finetune_train.py").write_text("")
    assert starter.likely_script(tmp_path) == "finetune_train.py"
    (tmp_path / "train.py").write_text("")
    assert starter.likely_script(tmp_path) == "train.py"
    steps = starter.to_edit("gcp", Path("stacks/Pulumi.gcp.yaml"), script="main.py")
    assert not any("gcp:project" in s for s in steps)  # given with --gcp-project
    assert any("--script main.py" in s for s in steps) and any("gpu-train plan --stack gcp" in s for s in steps)
    for page in {m for s in steps for m in re.findall(r"(/\S+\.md)", s)}:
        assert Path(page).is_file(), page
    from gpu_train.catalog.loader import load_catalog

    text = starter.gcp_stack("p", starter.starter_shape(load_catalog(), "L4", "us-central1-a", False, True), "198.51.100.7/32")
    assert "README" not in text and all(Path(p).is_file() for p in re.findall(r"(/\S+\.md)", text))


@pytest.mark.parametrize(("kind", "several", "flagged"), [("ssh", False, 0), ("ssh", True, 3), ("gcp", False, 2), ("gcp", True, 3)])
def test_init_next_steps_name_the_new_stack_when_there_are_several(kind: str, several: bool, flagged: int) -> None:
    """A second `init` printed `gpu-train ssh -- nvidia-smi`, which then stopped at "no stack selected" (plan and
    up, this clone's scripts, always take the stack)."""
    from remote.tasks import starter

    steps = starter.to_edit(kind, Path("stacks/Pulumi.box2.yaml"), several)
    commands = [s for s in steps if "gpu-train " in s]
    assert sum("gpu-train " in s and " --stack box2 " in s.split("gpu-train ", 1)[1] for s in commands) == flagged
    assert all(" --stack lab" not in s for s in steps)


@pytest.mark.parametrize("argv", [["trian"], ["train", "--scrpit", "x.py"], ["--stak", "lab", "status"], ["--help", "trian"]])
def test_a_mistyped_task_or_option_is_a_usage_error(argv: list[str], tmp_path: Path) -> None:
    """Exit 2 (bad input, nothing done), as a mistyped stack is; Invoke's own exit 1 reads as a failed job."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    cli = [sys.executable, "-c", "from gpu_train.launcher import main; main()", *argv]
    done = subprocess.run(cli, cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "No idea what" in done.stderr, done.stderr


def test_two_trains_in_one_second_are_named_a_second_apart(tmp_path: Path) -> None:
    """Run ids go to the second: a train within a second of the last one named for the stack here takes the
    next second (the host refused the second one as already there), while the clock goes on as it is."""
    from datetime import datetime, timedelta

    from remote.tasks.localstate import run_time

    cache, now = tmp_path / "cache", datetime(2026, 11, 28, 12, 0, 0, 400000)
    second = timedelta(seconds=1)
    assert run_time(cache, now) == now.replace(microsecond=0)
    assert run_time(cache, now) == now.replace(microsecond=0) + second  # the same second again: the next
    assert run_time(cache, now + second / 2) == now.replace(microsecond=0) + 2 * second
    assert run_time(cache, now + 10 * second) == now.replace(microsecond=0) + 10 * second  # past it: now
    assert run_time(cache, now - timedelta(hours=2)) == (now - timedelta(hours=2)).replace(microsecond=0)  # a clock set back: now
    (cache / "last-run-time").write_text("not a time\n")
    assert run_time(cache, now) == now.replace(microsecond=0)
