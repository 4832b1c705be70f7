"""Hostile stack values, run ids and file names, checked as what they become (tables; no I/O but files).

The sshd-backed half (the same values through the real `fab` tasks) is tests/e2e/test_hostile_hosts.py.
"""

from __future__ import annotations

import os
import subprocess
import time
import tracemalloc
from pathlib import Path

import pytest

from gpu_train import jobs
from gpu_train.catalog.loader import load_catalog
from gpu_train.gcp import validate
from gpu_train.stack import config, stackfile, values
from gpu_train.stack.config import ConfigError
from remote.transfer import ignores, sync
from tests.conftest import gcp_raw

CATALOG = load_catalog()


def ssh_raw(**overrides: object) -> dict[str, object]:
    raw: dict[str, object] = {"gpu-train:target": "ssh", "gpu-train:hosts": ["me@box.lab:22"], "gpu-train:sshKey": "/k/id"}
    raw.update({(k if ":" in k else f"gpu-train:{k}"): v for k, v in overrides.items()})
    return raw


def problems(raw: dict) -> list[config.Problem]:
    with pytest.raises(ConfigError) as e:
        validate.check(raw, "s", CATALOG)
    return e.value.problems


# (settings, key, words): each must be refused, naming the key and the problem.
HOSTILE = [
    (ssh_raw(hosts=["root@h\n  ProxyCommand touch /tmp/pwned"]), "hosts", "whitespace or control"),
    (ssh_raw(hosts=["root@h ProxyCommand=touch"]), "hosts", "whitespace or control"),
    (ssh_raw(hosts=["-oProxyCommand=touch@h"]), "hosts", "starts with '-'"),
    (ssh_raw(hosts=["me@-oProxyCommand=x"]), "hosts", "starts with '-'"),
    (ssh_raw(hosts=["me@" + "a" * 64 + ".lab"]), "hosts", "longer than 63"),
    (ssh_raw(hosts=["me@" + ".".join(["a" * 60] * 5)]), "hosts", "longer than 253"),
    (ssh_raw(hosts=["me@box_1.lab"]), "hosts", "not a host name"),
    (ssh_raw(hosts=["me;touch x@box"]), "hosts", "not a login name"),
    (ssh_raw(hosts=["m\te@box"]), "hosts", "not a login name"),
    (ssh_raw(remoteRoot='/opt/x"; touch /tmp/pwned; "'), "remoteRoot", "only letters"),
    (ssh_raw(remoteRoot="/opt/x\ntouch /tmp/pwned"), "remoteRoot", "only letters"),
    (ssh_raw(remoteRoot="/opt/my runs"), "remoteRoot", "only letters"),
    (ssh_raw(remoteRoot="~/$(touch /tmp/pwned)"), "remoteRoot", "only letters"),
    (ssh_raw(remoteRoot="~/`id`"), "remoteRoot", "only letters"),
    (ssh_raw(remoteRoot="relative/dir"), "remoteRoot", "absolute path or ~/PATH"),
    (ssh_raw(remoteRoot="~other/x"), "remoteRoot", "absolute path or ~/PATH"),
    (ssh_raw(remoteRoot="/srv/../etc"), "remoteRoot", "'..'"),
    (ssh_raw(remoteRoot="/"), "remoteRoot", "not be /"),
    (ssh_raw(remoteRoot="~/"), "remoteRoot", "home directory itself"),
    (ssh_raw(remoteRoot="/x/{node}{other}"), "remoteRoot", "only letters"),
    (ssh_raw(remoteRoot="/x/" + "a" * 300), "remoteRoot", "longer than 200"),
    (gcp_raw(remoteRoot="~/gt-{node}"), "remoteRoot", "only SSH stacks expand"),
    (ssh_raw(sshKey="/k/id\n  ProxyCommand touch /tmp/pwned"), "sshKey", "control character"),
    (ssh_raw(knownHosts="/k/kh\rx"), "knownHosts", "control character"),
    (ssh_raw(python="-c"), "python", "starts with '-'"),
    (gcp_raw(nodes=100000, machineType="g2-standard-8", gpuType=None, gpuCount=None), "nodes", "at most 256"),
    (gcp_raw(quotaRequest={"gpus": "99999999", "justification": "x", "contactEmail": "a@b.c"}), "quotaRequest", "at most 10000"),
    (gcp_raw(sshSourceRanges=["0.0.0.0/1", "128.0.0.0/1"]), "sshSourceRanges", "1/2 of the IPv4"),
    (gcp_raw(sshSourceRanges=["10.0.0.0/7"]), "sshSourceRanges", "wider than /8"),
    (gcp_raw(sshSourceRanges=["2000::/3"]), "sshSourceRanges", "IPv6 internet"),
    (gcp_raw(sshSourceRanges=["2001:db8::/31"]), "sshSourceRanges", "wider than /32"),
    (ssh_raw(idleStopMinutes=-5), "idleStopMinutes", "0 (off) or more"),
    (ssh_raw(maxResumes=-2), "maxResumes", "0 (never resume) or more"),
    ({**gcp_raw(), "gcp:project": "a/../../v1/x?y="}, "gcp:project", "not a project id"),  # (it goes in API paths)
    ({**gcp_raw(), "gcp:project": "my project"}, "gcp:project", "not a project id"),
    ({**gcp_raw(), "gcp:project": "123456789012"}, "gcp:project", "the id, not the project's name or number"),
]


@pytest.mark.parametrize(("raw", "key", "words"), HOSTILE)
def test_hostile_values_are_refused_naming_the_setting(raw: dict, key: str, words: str) -> None:
    found = problems(raw)
    assert any(p.key == key and words in str(p) for p in found), "\n".join(map(str, found))
    for p in found:
        assert "\n" not in str(p).split("\n    fix:")[0], "a message line must not carry the value's newlines"


@pytest.mark.parametrize(
    "raw",
    [
        ssh_raw(hosts=["me@box.lab:2222", "me@10.0.0.2", "me@[::1]:22", "u.name@gpu-1.lab."]),
        ssh_raw(remoteRoot="/srv/gt/{node}"),
        ssh_raw(remoteRoot="~/gpu-train"),
        ssh_raw(remoteRoot="/data/x_y-z.1+2"),
        gcp_raw(sshSourceRanges=["10.0.0.0/8", "2001:db8::/32"]),
        {**gcp_raw(), "gcp:project": "my-lab-project-42"},
        {**gcp_raw(), "gcp:project": "example.com:ml-team"},
        gcp_raw(sshSourceRanges=["0.0.0.0/1", "128.0.0.0/1"], allowSshFromAnywhere=True),
    ],
)
def test_ordinary_values_pass(raw: dict) -> None:
    validate.check(raw, "s", CATALOG)


def test_messages_never_print_an_unbounded_value() -> None:
    huge = "x" * 1_000_000
    text = str(ConfigError(problems({**ssh_raw(remoteRoot="/" + huge), f"gpu-train:{huge}": huge}), "s"))
    assert len(text) < 2000 and "characters)" in text


def test_yaml_aliases_are_refused_quickly(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    path = tmp_path / "Pulumi.bomb.yaml"
    path.write_text("config:\n  gpu-train:target: ssh\n" + "".join("  " + line + "\n" for line in bomb.splitlines()))
    tracemalloc.start()
    started = time.monotonic()
    with pytest.raises(ConfigError, match="aliases"):
        stackfile.read_stack_file(path)
    assert time.monotonic() - started < 2 and tracemalloc.get_traced_memory()[1] < 50 << 20
    tracemalloc.stop()


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"config:\n  gpu-train:remoteRoot: \xff\xfe\n", "not UTF-8"),
        (None, "is a directory"),
        (b"config: [" * 100_000, "not valid YAML|nests too deeply"),
        (b"#" * (2 << 20), "over 1 MiB"),
    ],
)
def test_unreadable_stack_files_are_messages(tmp_path: Path, content: bytes | None, words: str) -> None:
    path = tmp_path / "Pulumi.s.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=words) as e:
        stackfile.read_stack_file(path)
    assert len(str(e.value)) < 2000


@pytest.mark.parametrize("text", ["../../../victim/planted", "a/b", "..", "", "x" * 129, "_x", "1abc", "a b", "a\nb", None, 7, ["a"]])
def test_run_ids_from_hosts_and_users_are_checked(text: object) -> None:
    with pytest.raises(jobs.JobError, match="is not a run id"):
        jobs.check_run_id(text)


def test_a_good_run_id_passes() -> None:
    assert jobs.check_run_id("train_20260101_000000") == "train_20260101_000000"
    assert jobs.check_run_id("a" * 128) == "a" * 128


def test_script_named_like_an_option_stays_a_file_and_bad_args_are_messages(tmp_path: Path) -> None:
    (tmp_path / "-V").write_text("print('ran')\n")
    spec = jobs.job_spec(run="r_1", base="r", script="-V", command=None, args="", env=[], python=None, expect_gpus=0, code_dir=tmp_path)
    assert spec.script == "./-V"
    (tmp_path / "t.py").write_text("")
    with pytest.raises(jobs.JobError, match="--args"):
        jobs.job_spec(run="r_1", base="r", script="t.py", command=None, args="it's", env=[], python=None, expect_gpus=0, code_dir=tmp_path)


# -- rsync --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("rsync  version 3.5.0  protocol version 32", True),
        ("rsync  version 3.4.0  protocol version 32", True),
        ("rsync  version v3.4.1  protocol version 32", True),
        ("rsync  version 3.3.0  protocol version 31", False),
        ("rsync  version 3.2.3  protocol version 31", False),
        ("openrsync: protocol version 29\nrsync version 2.6.9 compatible", False),
        ("garbage", False),
        (None, False),
    ],
)
def test_rsync_versions(version: str | None, ok: bool) -> None:
    why = sync.rsync_problem(version)
    assert (why is None) == ok
    if not ok:
        assert "3.4.0" in why


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("a.py", "a.py"),
        ("secret[prod].env", "secret\\[prod].env"),
        ("api[1].key", "api\\[1].key"),
        ("model?.ckpt", "model\\?.ckpt"),
        ("a\\b", "a\\b"),
        ("a\\b*", "a\\\\b\\*"),
        ("x\ny", "x?y"),
        ("x\\\ny", "x\\\\?y"),
    ],
)
def test_rsync_literal(name: str, pattern: str) -> None:
    assert ignores.rsync_literal(name) == pattern


def test_git_ignored_names_with_wildcards_match_only_themselves(tmp_path: Path) -> None:
    """Ignored `secret[prod].env`, `api[1].key` and `model?.ckpt` stay home; tracked `modelB.ckpt` goes."""
    code = tmp_path / "code"
    code.mkdir()
    for name in ("keep.py", "secret[prod].env", "api[1].key", "model?.ckpt", "modelB.ckpt", "we*rd.txt", "weXrd.txt"):
        (code / name).write_text(name)
    (code / ".gitignore").write_text("secret[[]prod].env\napi\\[1\\].key\nmodel\\?.ckpt\nwe\\*rd.txt\n")
    subprocess.run(["git", "init", "-q", str(code)], check=True)
    plan = sync.plan_code(code, tmp_path)
    listing = subprocess.run(sync.list_command(code, plan.exclude, plan.git_mode), capture_output=True, text=True, check=True).stdout
    sent = sorted(line.split(None, 4)[4] for line in listing.splitlines() if line.startswith("-"))
    assert sent == [".gitignore", "keep.py", "modelB.ckpt", "weXrd.txt"]


def test_a_projects_git_config_runs_nothing_here(tmp_path: Path) -> None:
    """A project's .git/config (a shared folder, an archive) naming core.fsmonitor: git runs it for
    ls-files and check-ignore, so planning the code sync ran it on the laptop. Our git calls refuse it."""
    code, mark = tmp_path / "code", tmp_path / "ran"
    code.mkdir()
    (code / "train.py").write_text("print()")
    (code / "data.bin").write_text("x")
    (code / ".gitignore").write_text("data.bin\n")
    subprocess.run(["git", "init", "-q", str(code)], check=True)
    subprocess.run(["git", "-C", str(code), "config", "core.fsmonitor", f"touch {mark}; false #"], check=True)
    plan = sync.plan_code(code, tmp_path)
    assert plan.left_out and ignores.ignore_sources(code, ["data.bin"]) == {"data.bin": ".gitignore"}
    assert not mark.exists()


def test_every_rsync_protects_its_arguments() -> None:
    """(Fetching is no longer rsync: what it receives is checked in tests/unit/test_fetch_engine.py.)"""
    from tests.unit.test_jobs_sync_target import lab_target

    t = lab_target()
    push = sync.push_command(t, t.host, Path("/code"), "run_1", "run", None, git_mode=False)
    assert sync.PROTECT in push


def test_values_module_knows_its_limits() -> None:
    assert values.host_problem("::1") is None and values.host_problem("10.0.0.1") is None
    assert values.login_problem("-x") and values.login_problem("ok_user") is None


def _learn(args: tuple[str, int]) -> None:
    from remote.ssh.hostkeys import append_known_host

    path, worker = args
    for i in range(15):
        append_known_host(Path(path), f"[10.0.{worker}.{i}]:22 ssh-ed25519 AAAAkey{worker}x{i}\n")


def test_known_hosts_learned_at_once_keep_every_line(tmp_path: Path) -> None:
    """Many hosts learned at once (the nodes of a cluster, several tasks): no line is lost."""
    import multiprocessing

    path = tmp_path / "known_hosts"
    with multiprocessing.get_context("fork").Pool(6) as pool:
        pool.map(_learn, [(str(path), w) for w in range(6)])
    lines = path.read_text().splitlines()
    assert len(lines) == len(set(lines)) == 6 * 15


def test_remote_root_guard(tmp_path: Path) -> None:
    from agent.guard import UnsafeRoot, check_own_file, secure_root

    made = Path(secure_root(str(tmp_path / "a" / "b" / "root")))
    for p in (made, made.parent, made.parent.parent):
        assert p.stat().st_mode & 0o777 == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    secure_root(str(loose))
    assert loose.stat().st_mode & 0o777 == 0o700  # ours and closed to others: narrowed
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (tmp_path / "link").symlink_to(made)
    (tmp_path / "file").write_text("")
    for path, words in (
        (open_dir, "writable by group or others"),
        (tmp_path / "link", "symbolic link"),
        (tmp_path / "file", "not a directory"),
    ):
        with pytest.raises(UnsafeRoot, match=words):
            secure_root(str(path))
    shared = tmp_path / "shared"  # another user's world-writable directory without the sticky bit
    shared.mkdir()
    shared.chmod(0o777)
    if os.geteuid() == 0:
        os.chown(shared, 65534, 65534)
        with pytest.raises(UnsafeRoot, match="belongs to nobody"):
            secure_root(str(shared / "root"))
    shared.chmod(0o1777)
    if os.geteuid() == 0:  # sticky, but its owner may rename anything in it (issue 28 O)
        with pytest.raises(UnsafeRoot, match="belongs to nobody"):
            secure_root(str(shared / "root2"))
        os.chown(shared, 0, 0)  # as /tmp: root's, sticky: others cannot rename what is ours
        secure_root(str(shared / "root2"))
        shared.chmod(0o777)
        with pytest.raises(UnsafeRoot, match="no sticky bit"):
            secure_root(str(shared / "root3"))
        assert not (shared / "root3").exists()  # refused before anything was made
    assert secure_root(str(tmp_path / "absent"), own=False) and not (tmp_path / "absent").exists()
    agent = made / "agent"
    agent.write_text("")
    agent.chmod(0o777)
    with pytest.raises(UnsafeRoot, match="writable by others"):
        check_own_file(str(agent))
