"""The e2e tier of tests/unit/test_alias_tunnel.py (the same subject; its helpers are there)."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.environment import Environment
from gpu_train.stack.stackfile import load_stack
from remote.loopback import Sshd, free_port
from remote.ssh import alias as sshalias
from remote.ssh import connect as ssh
from remote.ssh.forward import ForwardError, LocalForward, pick_local_port, remote_listens
from remote.ssh.target import target_from
from remote.tasks import notebooks
from tests.conftest import EXAMPLE, FAB, ROOT, Lab


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An SSH stack `lab` on a real sshd, a HOME of its own, and the stack's target."""
    sshd = Sshd(tmp_path / "sshd", "127.0.15.3").start()
    stacks, state = tmp_path / "stacks", tmp_path / "state"
    sshd.stack_file(stacks, "lab", tmp_path / "remote", sys.executable)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    target = target_from(load_stack("lab", load_catalog(), [stacks], "gpu-train"), None, state)
    yield sshd, target, state
    sshd.stop()


def test_alias_written_once_said_once_and_used_by_ssh(host) -> None:
    _, target, state = host
    said: list[str] = []
    asked: list[str] = []
    alias = sshalias.at_first_contact(target, state, said.append, ask=lambda q: asked.append(q) or "y")
    assert alias == "gpu-train-lab" and len(asked) == 1 and any("ssh gpu-train-lab," in s for s in said)
    conf = Path(os.environ["HOME"]) / ".ssh" / "config"
    assert conf.read_text().startswith(sshalias.MARK)
    # the second contact says nothing and asks nothing
    said.clear()
    sshalias.at_first_contact(target, state, said.append, ask=lambda q: asked.append(q) or "y")
    assert said == [] and len(asked) == 1
    ssh.open_connection(target, target.host, 10, said.append).close()  # learn the host key into the stack's known_hosts
    for name in ("gpu-train-lab",):
        result = subprocess.run(
            ["ssh", "-F", str(conf), "-o", "BatchMode=yes", name, "true"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode == 0, result.stderr
    done = sshalias.remove(state)
    assert any("Include" in d for d in done) and not list((state / "ssh_config.d").glob("*.conf"))
    assert sshalias.include_line(state) not in conf.read_text()


def test_include_is_never_added_silently(host) -> None:
    _, target, state = host
    said: list[str] = []
    sshalias.at_first_contact(target, state, said.append, ask=None)  # no terminal: tell, do not touch
    assert not (Path(os.environ["HOME"]) / ".ssh" / "config").exists()
    assert any("gpu-train ssh-config" in s for s in said)
    # a "no" is remembered: not asked again
    other = target_from(load_stack("lab", load_catalog(), [state.parent / "stacks"], "gpu-train"), None, state / "other")
    asked: list[str] = []
    sshalias.at_first_contact(other, state / "other", said.append, ask=lambda q: asked.append(q) or "n")
    (state / "other" / "ssh_config.d" / "gpu-train-lab.conf").unlink()
    sshalias.at_first_contact(other, state / "other", said.append, ask=lambda q: asked.append(q) or "y")
    assert len(asked) == 1 and not (Path(os.environ["HOME"]) / ".ssh" / "config").exists()


def test_a_stack_name_never_shadows_a_real_host(host, tmp_path: Path) -> None:
    # A shared stack called github.com wrote `Host gpu-train-github.com github.com`: once included,
    # `git` to github.com went to the stack's host (issue 28 I).
    _, target, state = host
    import dataclasses

    sshalias.write_alias(dataclasses.replace(target, stack="github.com"), state, tmp_path)
    sshalias.add_include(state)
    conf = Path(os.environ["HOME"]) / ".ssh" / "config"
    dump = subprocess.run(["ssh", "-G", "-F", str(conf), "github.com"], capture_output=True, text=True, check=True).stdout
    assert "hostname github.com\n" in dump and f"port {target.host.port}\n" not in dump
    dump = subprocess.run(["ssh", "-G", "-F", str(conf), "gpu-train-github.com"], capture_output=True, text=True).stdout
    assert f"hostname {target.host.host}\n" in dump


def test_the_include_is_the_users_folder_and_only_our_files(host, tmp_path: Path, monkeypatch) -> None:
    # The Include named the project's .gpu-train/ssh_config.d/*.conf: any committed *.conf there
    # became part of every ssh the user ran (a Match exec ran each time).
    _, target, _ = host
    home = sshalias.own_home(Environment())
    assert home == Path(os.environ["HOME"]) / ".ssh" / "gpu-train"
    mark = tmp_path / "ran"
    project = tmp_path / "project" / ".gpu-train" / "ssh_config.d"
    project.mkdir(parents=True)
    (project / "gpu-train-x.conf").write_text(f'Match exec "touch {mark}"\n')
    sshalias.write_alias(target, home, tmp_path / "project")
    (sshalias.alias_dir(home) / "notes.conf").write_text(f'Match exec "touch {mark}"\n')  # not ours: not read
    conf = sshalias.add_include(home)
    assert str(project) not in conf.read_text()
    subprocess.run(["ssh", "-G", "-F", str(conf), "gpu-train-lab"], capture_output=True, check=True)
    assert not mark.exists()


def test_a_symlinked_ssh_config_is_edited_where_it_points(host, tmp_path: Path) -> None:
    # dotfiles: ~/.ssh/config -> ~/dotfiles/ssh_config was replaced by a plain file.
    _, target, state = host
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "ssh_config").write_text("Host mine\n  HostName example.org\n")
    conf = Path(os.environ["HOME"]) / ".ssh" / "config"
    conf.parent.mkdir(parents=True)
    conf.symlink_to(dotfiles / "ssh_config")
    sshalias.write_alias(target, state, tmp_path)
    sshalias.add_include(state)
    assert conf.is_symlink() and (dotfiles / "ssh_config").read_text().startswith(sshalias.MARK)
    assert "Host mine\n" in (dotfiles / "ssh_config").read_text()
    sshalias.remove(state)
    assert conf.is_symlink() and (dotfiles / "ssh_config").read_text() == "Host mine\n  HostName example.org\n"


def test_an_older_include_of_a_project_folder_is_replaced(host) -> None:
    _, _, state = host
    conf = Path(os.environ["HOME"]) / ".ssh" / "config"
    conf.parent.mkdir(parents=True)
    conf.write_text(f'{sshalias.MARK}\nInclude "/work/project/.gpu-train/ssh_config.d/*.conf"\n\nHost mine\n')
    sshalias.add_include(state)
    assert conf.read_text() == f"{sshalias.MARK}\n{sshalias.include_line(state)}\n\nHost mine\n"


# -- forwarding ----------------------------------------------------------------------------------
def test_busy_local_port_and_silent_remote_port(host) -> None:
    _, target, _ = host
    conn = ssh.open_connection(target, target.host, 10, lambda _: None)
    try:
        transport = conn.client.get_transport()
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen(1)
            with pytest.raises(ForwardError, match=f"local port {busy.getsockname()[1]} is busy"):
                LocalForward(transport, 22, busy.getsockname()[1])
        silent = free_port("127.0.0.1")
        assert not remote_listens(transport, silent)
        with pytest.raises(ForwardError, match=f"nothing listens on 127.0.15.3 127.0.0.1:{silent}"):
            notebooks.tunnel(conn, target, silent, None, lambda _: None, lambda _: None, wait=lambda: None)
        assert pick_local_port(silent) == silent
    finally:
        conn.close()


def command_lines() -> list[bytes]:
    """Every process's command line, as any user of the machine reads it."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            out.append((proc / "cmdline").read_bytes())
        except OSError:
            continue
    return out


def test_tensorboard_through_the_tunnel_and_gone_after_ctrl_c(host, tmp_path: Path) -> None:
    # The host script's spec (Jupyter's token) was its argument: /proc showed it to every user there.
    canary = "spec-canary-3f9a1c"
    _, target, _ = host
    conn = ssh.open_connection(target, target.host, 10, lambda _: None)
    urls: list[str] = []
    said: list[str] = []
    seen: dict = {}
    stop = threading.Event()

    def wait() -> None:  # what the user does: open the page, then press Ctrl-C
        url = urls[0]
        seen["page"] = urllib.request.urlopen(url, timeout=30).read().decode()
        seen["pid"] = int(said[0].split("pid ")[1].split(",")[0])
        seen["argv"] = [c for c in command_lines() if canary.encode() in c or url.split("/")[3].encode() in c]
        remote_port = int(said[0].split("127.0.0.1:")[1].split(",")[0])
        for port in (remote_port, int(url.split(":")[2].split("/")[0])):  # the host's port, this laptop's forward
            with pytest.raises(urllib.error.HTTPError, match="404"):  # any other local user, without the secret
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30)
        stop.set()
        raise KeyboardInterrupt

    logdir = notebooks.logdir_for(target.remote_root, None, None)
    try:
        notebooks.serve(
            conn,
            target,
            "tensorboard",
            {"logdir": logdir, "startTimeoutS": 240, "note": canary},
            None,
            said.append,
            urls.append,
            wait=wait,
            project="default",
        )
    finally:
        conn.close()
    assert stop.is_set() and "<title>TensorBoard</title>" in seen["page"]
    assert seen["argv"] == [], "the spec is on a command line"
    port = int(urls[0].split(":")[2].split("/")[0])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # the local end is closed
    remote_port = int(said[0].split("127.0.0.1:")[1].split(",")[0])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", remote_port), timeout=1).close()
            time.sleep(0.2)
        except OSError:
            break
    else:
        pytest.fail("TensorBoard still listens on the host after Ctrl-C")
    assert not Path(f"/proc/{seen['pid']}").exists(), "the server's process is gone"
    assert said[-1].startswith("stopped tensorboard on ")


def test_jupyter_missing_on_the_host_says_how_to_get_it(host, tmp_path: Path) -> None:
    """The host's Python is a bare venv of its own, which has no jupyterlab whatever the tests' venv holds
    (requirements-test.txt installs jupyterlab for test_shared_host's Jupyter)."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    _, target, _ = host
    target = dataclasses.replace(target, python=str(bare / "bin" / "python"))
    conn = ssh.open_connection(target, target.host, 10, lambda _: None)
    try:
        with pytest.raises(ForwardError, match=r"no jupyterlab in .* on this host: add jupyterlab to your requirements\.txt"):
            notebooks.serve(
                conn, target, "jupyter", {"dir": str(target.remote_root)}, None, lambda _: None, lambda _: None, project="default"
            )
    finally:
        conn.close()


# -- through `fab`, as a user would (the conftest's `lab`) ----------------------------------------
def test_ssh_config_entry_and_plain_ssh(lab: Lab) -> None:
    env = {**lab.env, "HOME": str(lab.tmp / "userhome")}
    first = subprocess.run(
        [FAB, "--search-root", str(ROOT), "status"],
        env=env,
        cwd=lab.cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert "ssh alias: ssh gpu-train-lab," in first.stderr and "fab ssh-config" in first.stderr
    config = lab.tmp / "userhome" / ".ssh" / "config"
    assert not config.exists()  # never edited without being asked
    for _ in range(2):
        added = subprocess.run(
            [FAB, "--search-root", str(ROOT), "ssh-config"],
            env=env,
            cwd=lab.cwd,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert added.returncode == 0, added.stderr
    assert config.read_text().count("Include ") == 1  # idempotent
    out = subprocess.run(
        ["ssh", "-F", str(config), "-o", "BatchMode=yes", "gpu-train-lab", "echo via-alias"],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert out.stdout.strip() == "via-alias", out.stderr
    removed = subprocess.run(
        [FAB, "--search-root", str(ROOT), "ssh-config", "--remove"],
        env=env,
        cwd=lab.cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert "removed the Include line" in removed.stdout and "Include" not in config.read_text()


def test_tunnel_forwards_a_port(lab: Lab) -> None:
    remote_port, local_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(remote_port), "--bind", "127.0.0.1", "--directory", str(EXAMPLE)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tunnel = lab.spawn("tunnel", "--port", str(remote_port), "--local-port", str(local_port))
    try:
        body = b""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not body:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{local_port}/train.py", timeout=2).read()
            except OSError:
                time.sleep(0.2)
        assert body == (EXAMPLE / "train.py").read_bytes()
    finally:
        tunnel.terminate()
        server.terminate()
        tunnel.wait(10)
        server.wait(10)


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP"])
def test_jupyter_stopped_by_a_process_manager_or_a_closed_terminal_as_by_ctrl_c(lab: Lab, stop: str) -> None:
    """SIGTERM (systemd, `timeout`, `kill`) or SIGHUP (the terminal closed) to `jupyter` alone: it closes the
    forward and stops the server on the host, says so and exits 0, as Ctrl-C does (it died on the spot)."""
    import json
    import signal

    pytest.importorskip("jupyterlab")
    served = lab.spawn("jupyter", "--json")
    try:
        line = served.stdout.readline()  # type: ignore[union-attr]  # (a PIPE: never None)
        assert line, served.communicate(timeout=60)
        url = json.loads(line)["url"]
        said = served.stderr.readline()  # type: ignore[union-attr]  # (a PIPE: never None)
        while said and " pid " not in said:
            said = served.stderr.readline()  # type: ignore[union-attr]  # (a PIPE: never None)
        pid = int(said.split(" pid ")[1].split(",")[0])  # the server's, on the host (this machine)
        with urllib.request.urlopen(url, timeout=60) as page:
            assert page.status == 200
    finally:
        served.send_signal(getattr(signal, stop))
        _, rest = served.communicate(timeout=60)
    assert served.returncode == 0 and "stopped jupyter on " in rest, (served.returncode, rest)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "Jupyter still runs on the host"
    with pytest.raises(OSError):  # the local end is closed
        urllib.request.urlopen(url, timeout=5)
