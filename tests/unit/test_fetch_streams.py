"""The parallel fetch's streams and connections against a real sshd: how many, on which connection
(the shared one, the fetch's own, their own), and what happens when the shared one cannot serve."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from remote.transfer.fetch import stream as fetch_stream


@pytest.fixture
def short_tmp():
    """A temporary folder with a short path (pytest's own are too long for a socket's)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gt-"))
    yield path
    shutil.rmtree(path)


def test_the_shared_connection_is_per_key_and_host_in_a_folder_of_ours(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp_path = short_tmp
    monkeypatch.setattr(fetch_stream.tempfile, "gettempdir", lambda: str(tmp_path))
    a = fetch_stream.shared_control_path(["-i", "/k/one", "-o", "UserKnownHostsFile=/s/a"], "u@h")
    assert a is not None and Path(a).parent == tmp_path / f"gpu-train-ssh-{os.getuid()}"
    assert (Path(a).parent.stat().st_mode & 0o777) == 0o700
    assert a == fetch_stream.shared_control_path(["-i", "/k/one", "-o", "UserKnownHostsFile=/s/a"], "u@h")
    others = {
        fetch_stream.shared_control_path(["-i", "/k/two", "-o", "UserKnownHostsFile=/s/a"], "u@h"),
        fetch_stream.shared_control_path(["-i", "/k/one", "-o", "UserKnownHostsFile=/s/b"], "u@h"),
        fetch_stream.shared_control_path(["-i", "/k/one", "-o", "UserKnownHostsFile=/s/a"], "u@h2"),
    }
    assert a not in others and len(others) == 3
    Path(a).parent.chmod(0o755)  # a folder others can read (or one planted by someone else): not used
    assert fetch_stream.shared_control_path(["-i", "/k/one"], "u@h") is None
    Path(a).parent.rmdir()
    Path(a).parent.symlink_to(tmp_path)
    assert fetch_stream.shared_control_path(["-i", "/k/one"], "u@h") is None
    for name, mode in (("open", 0o777), ("per%cent", 0o700)):  # others may rename in it; ssh would expand %
        (tmp_path / name).mkdir(mode=mode)
        (tmp_path / name).chmod(mode)
        monkeypatch.setattr(fetch_stream.tempfile, "gettempdir", lambda name=name: str(tmp_path / name))
        assert fetch_stream.shared_control_path(["-i", "/k/one"], "u@h") is None
    (tmp_path / "open").chmod(0o1777)  # sticky, as /tmp: only a file's owner may rename it
    monkeypatch.setattr(fetch_stream.tempfile, "gettempdir", lambda: str(tmp_path / "open"))
    assert fetch_stream.shared_control_path(["-i", "/k/one"], "u@h") is not None
    monkeypatch.setattr(fetch_stream.tempfile, "gettempdir", lambda: str(tmp_path / ("x" * 90)))
    (tmp_path / ("x" * 90)).mkdir()
    assert fetch_stream.shared_control_path(["-i", "/k/one"], "u@h") is None  # too long for a socket's path


def test_a_request_of_megabytes_is_sent_whole_while_signals_interrupt_its_write(tmp_path: Path) -> None:
    """A signal during a blocking write to a pipe (Ctrl-Z and fg, a debugger attaching) ends it early with
    part of the data taken; the rest must still go, or the host waits for the end of the line forever."""
    got = tmp_path / "got"
    stream = fetch_stream.Stream(["sh", "-c", f'sleep 0.3; cat > "{got}"'])  # slow to read: the write blocks
    request = {"op": "read", "items": [["run", f"file{i:06d}", 0, 100] for i in range(100_000)]}
    main, stop = threading.get_ident(), threading.Event()

    def pester() -> None:
        while not stop.is_set():
            signal.pthread_kill(main, signal.SIGUSR1)
            time.sleep(0.002)

    old = signal.signal(signal.SIGUSR1, lambda *_: None)  # with a handler, an interrupted write returns short
    pest = threading.Thread(target=pester)
    pest.start()
    try:
        stream.send(request)
    finally:
        stop.set()
        pest.join()
        signal.signal(signal.SIGUSR1, old)
    stream.proc.stdin.close()  # type: ignore[union-attr]  # (a PIPE: never None)
    assert stream.proc.wait(timeout=30) == 0
    assert got.read_bytes() == json.dumps(request, separators=(",", ":")).encode() + b"\n"
