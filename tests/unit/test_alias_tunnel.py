"""The ssh alias (written once, used by a real `ssh gpu-train-STACK true`), local forwarding with its
failures, and TensorBoard on the host reachable through the tunnel and gone after Ctrl-C: all on a
real sshd on 127.0.15.x."""

from __future__ import annotations

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
        ("~/gpu-train", "r_1", None, "~/gpu-train/runs/r_1/job"),
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
    assert notebooks.url_for("jupyter", 8888, "abc") == "http://127.0.0.1:8888/?token=abc"
    assert notebooks.url_for("tensorboard", 6006, "abc") == "http://127.0.0.1:6006/abc/"
