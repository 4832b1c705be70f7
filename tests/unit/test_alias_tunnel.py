"""The ssh alias (written once, used by a real `ssh gpu-train-STACK true`), local forwarding with its
failures, and TensorBoard on the host reachable through the tunnel and gone after Ctrl-C: all on a
real sshd on 127.0.15.x."""

from __future__ import annotations

from pathlib import Path

import pytest

from remote.ssh import alias as sshalias
from remote.tasks import notebooks


# -- the alias ------------------------------------------------------------------------------------
def test_entry_quotes_paths_and_refuses_what_ssh_config_cannot_hold() -> None:
    text = sshalias.entry("t4", [("me", "10.0.0.1", 22), ("me", "10.0.0.2", 22)], "/k/my key", "/kh")
    assert "Host gpu-train-t4\n" in text and "Host gpu-train-t4-1\n" in text and 'IdentityFile "/k/my key"' in text
    with pytest.raises(ValueError):
        sshalias.entry("t4", [("me", "10.0.0.1\n  ProxyCommand evil", 22)], "/k", "/kh")


# -- what the host runs -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("root", "run", "logdir", "expected"),
    [
        ("~/gpu-train", None, None, "~/gpu-train/runs"),
        ("~/gpu-train", "r_1", None, "~/gpu-train/runs/r_1"),  # JOB_DIR and its working directory (out/ of its own)
        ("/srv/gt/", None, "r_1/job/tb", "/srv/gt/runs/r_1/job/tb"),
        ("~/gpu-train", "r_1", "/data/tb", "/data/tb"),
    ],
)
def test_logdir(root: str, run: str | None, logdir: str | None, expected: str) -> None:
    assert notebooks.logdir_for(root, run, logdir) == expected


def test_server_command_lines_bind_localhost_only() -> None:
    from agent import serve as serve_host

    tb = serve_host.argv_for({"kind": "tensorboard", "logdir": "/l", "token": "t"}, "/py", "tensorboard.main", 7000)
    assert tb == ["/py", "-c", serve_host.TENSORBOARD, "--logdir", "/l", "--host", "127.0.0.1", "--port", "7000"]
    nb = serve_host.argv_for({"kind": "jupyter", "dir": "/w", "token": "t"}, "/py", "jupyterlab", 7001)
    assert "--ip=127.0.0.1" in nb and "--port=7001" in nb and "t" not in nb  # the token goes by environment, not argv
    as_root = serve_host.argv_for({"kind": "jupyter", "dir": "/w", "token": "t"}, "/py", "jupyterlab", 7001, uid=0)
    assert as_root[-1] == "--allow-root" and "--allow-root" not in serve_host.argv_for(
        {"kind": "jupyter", "dir": "/w", "token": "t"}, "/py", "jupyterlab", 7001, uid=1000
    )  # a root login (rented, container GPU boxes): Jupyter refuses root without it
    assert notebooks.url_for("jupyter", 8888, "abc") == "http://127.0.0.1:8888/?token=abc"
    assert notebooks.url_for("tensorboard", 6006, "abc") == "http://127.0.0.1:6006/abc/"


def test_a_cloned_projects_stack_never_takes_over_your_alias(tmp_path: Path) -> None:
    """A cloned project's stack `lab` silently rewrote the user's own `gpu-train-lab` to its host."""
    from types import SimpleNamespace

    from gpu_train.stack.config import SshHost

    def target(host: str) -> SimpleNamespace:
        return SimpleNamespace(stack="lab", hosts=[SshHost("me", host, 22)], key_file="/k", known_hosts=Path("/kh"))

    home, mine, cloned = tmp_path / "home", tmp_path / "mine", tmp_path / "clone" / "theirs"
    assert sshalias.write_alias(target("10.0.0.1"), home, mine) == ("gpu-train-lab", True)
    assert sshalias.write_alias(target("203.0.113.66"), home, cloned) == ("gpu-train-lab.theirs", True)
    ours = (home / "ssh_config.d" / "gpu-train-lab.conf").read_text()
    assert "HostName 10.0.0.1" in ours and sshalias.owner(home / "ssh_config.d" / "gpu-train-lab.conf") == str(mine)
    assert "Host gpu-train-lab.theirs\n" in (home / "ssh_config.d" / "gpu-train-lab.theirs.conf").read_text()
    assert sshalias.write_alias(target("10.0.0.9"), home, mine) == ("gpu-train-lab", False)  # a new address: refreshed
    assert "HostName 10.0.0.9" in (home / "ssh_config.d" / "gpu-train-lab.conf").read_text()
    older = home / "ssh_config.d" / "gpu-train-old.conf"  # an older gpu-train's file (no owner)
    same = sshalias.entry("old", [("me", "10.0.0.2", 22)], "/k", "/kh", [""], "gpu-train-old")
    older.write_text(same)
    assert sshalias.alias_for("old", cloned, home, lambda n: same) == "gpu-train-old"  # already what it would write
    for other in (
        sshalias.entry("old", [("me", "203.0.113.66", 22)], "/k", "/kh", [""], "gpu-train-old"),  # another host
        sshalias.entry("old", [("me", "10.0.0.2", 22)], "/k", "/kh", ["ssh -W %h:%p jump.evil"], "gpu-train-old"),  # a proxy
    ):
        assert sshalias.alias_for("old", cloned, home, lambda n, other=other: other) == "gpu-train-old.theirs"
    assert sshalias.alias_for("old", cloned, home) == "gpu-train-old.theirs"
    said: list[str] = []
    theirs_old = SimpleNamespace(stack="old", hosts=[SshHost("me", "203.0.113.66", 22)], key_file="/k", known_hosts=Path("/kh"))
    assert sshalias.at_first_contact(theirs_old, home, said.append, setting=False, project=cloned) == "gpu-train-old.theirs"
    assert older.read_text() == same  # the user's alias kept
    assert any("an older gpu-train's, for another host" in s and f"delete {older}" in s for s in said), said
    newline = tmp_path / "a\nHost *\n  ProxyCommand evil"  # a project path cannot write a line of config
    text = sshalias.entry("x", [("me", "10.0.0.1", 22)], "", "/kh", None, "gpu-train-x", newline)
    assert "\nHost *" not in text and "\n  ProxyCommand evil" not in text


@pytest.mark.parametrize(
    ("files", "deps", "said"),
    [
        ([], "requirements.txt", "add jupyterlab to your requirements.txt (the next train"),
        (["requirements.txt", "pyproject.toml"], "requirements.txt", "add jupyterlab to your requirements.txt (the next train"),
        # a uv project: a requirements.txt added as told would have replaced its uv.lock (requirements.txt comes first)
        (
            ["pyproject.toml", "uv.lock"],
            "pyproject.toml",
            "add jupyterlab to pyproject.toml's dependencies (`uv add jupyterlab` writes uv.lock too)",
        ),
    ],
)
def test_a_missing_server_is_added_where_the_project_lists_its_packages(tmp_path: Path, files: list[str], deps: str, said: str) -> None:
    from agent import serve as serve_host

    for name in files:
        (tmp_path / name).write_text("")
    assert notebooks.dependency_file(tmp_path) == deps
    no_jupyter = str(tmp_path / "python")  # (no such Python: nothing imports there)
    python, module, error = serve_host.choose({"kind": "jupyter", "python": no_jupyter, "venv": True, "dependencies": deps})
    assert python is None and module is None and error is not None and said in error, error
