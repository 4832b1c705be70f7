"""`logs --follow` on the host (agent/status.py::cmd_logs): a line is shown soon after it is written,
the stream ends soon after the run does, and no line written as the run ends is lost."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent import status
from agent.procs import proc_start_time
from gpu_train.contract import LOG_END


def _run(root: Path, state: str = "running") -> Path:
    d = root / "runs" / "job_20260101_000000"
    d.mkdir(parents=True)
    _record(d, state)
    (d / "log").write_text("first\n")
    return d


def _record(d: Path, state: str, exit_code: int | None = None) -> None:
    pid = os.getpid()
    record = {"id": d.name, "base": "job", "state": state, "project": "p-1", "created": 1.0, "pid": pid, "pidStart": proc_start_time(pid)}
    if exit_code is not None:
        record["exitCode"] = exit_code
    (d / "state.json").write_text(json.dumps(record))


class Streams:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.out, self.err = io.BytesIO(), io.StringIO()
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(self.out))
        monkeypatch.setattr(sys, "stderr", self.err)

    def trailer(self) -> dict[str, Any]:
        return dict(json.loads(self.err.getvalue().rsplit(LOG_END, 1)[1]))


def test_a_followed_log_is_read_again_soon_after_it_grew(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits start at 10 ms after each read that found something and grow to 0.3 s while the log is quiet
    (a fixed 0.3 s poll showed a job's first line up to 0.3 s late, and ended the stream 0.3 s late)."""
    d = _run(tmp_path)
    streams = Streams(monkeypatch)
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        if len(waits) == 7:
            with open(d / "log", "a") as f:
                f.write("second\n")
        if len(waits) == 9:
            _record(d, "succeeded", 0)

    monkeypatch.setattr("agent.status.time.sleep", sleep)
    status.cmd_logs(str(tmp_path), d.name, 0, None, True)
    assert waits == [0.01, 0.02, 0.04, 0.08, 0.16, 0.3, 0.3, 0.01, 0.02]
    assert streams.out.getvalue() == b"first\nsecond\n"
    assert streams.trailer()["state"] == "succeeded"


def test_a_line_written_as_the_run_ends_is_not_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's last line and its end can both land between a read of the log and the look at the run's
    state: the state is looked at first, so that an empty read after seeing the end is truly the end."""
    d = _run(tmp_path)
    streams = Streams(monkeypatch)
    monkeypatch.setattr("agent.status.time.sleep", lambda s: None)
    real_open = open
    ended = False

    class Log(io.BufferedReader):
        def read(self, size: int | None = -1) -> bytes:
            nonlocal ended
            at = self.tell()
            data = super().read(size)
            if at == len("first\n") and not data and not ended:  # the follow found nothing new: the last line and the end come now
                ended = True
                with real_open(d / "log", "a") as log:
                    log.write("last\n")
                _record(d, "succeeded", 0)
            return data

    def opening(path: Any, mode: str = "r", *a: Any, **kw: Any) -> Any:
        if str(path) == str(d / "log") and mode == "rb":
            return Log(io.FileIO(path, "r"))
        return real_open(path, mode, *a, **kw)

    monkeypatch.setattr("builtins.open", opening)
    status.cmd_logs(str(tmp_path), d.name, 0, None, True)
    assert streams.out.getvalue() == b"first\nlast\n"
    assert streams.trailer()["state"] == "succeeded"


def test_a_run_being_launched_is_awaited_then_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`train --follow` asks for the log as the launch answers (logs --await-run): the host waits for the
    run's record instead of answering that there is no such run."""
    d = tmp_path / "runs" / "job_20260101_000000"
    streams = Streams(monkeypatch)
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        if len(waits) == 3:  # the launch writes the run's folder, its log and then its record
            d.mkdir(parents=True)
            (d / "log").write_text("first\n")
            _record(d, "succeeded", 0)

    monkeypatch.setattr("agent.status.time.sleep", sleep)
    status.cmd_logs(str(tmp_path), d.name, 0, None, True, await_run=True)
    assert waits[:3] == [0.005, 0.01, 0.02]
    assert streams.out.getvalue() == b"first\n" and streams.trailer()["state"] == "succeeded"


def test_a_run_that_never_appears_is_awaited_no_longer_than_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "runs").mkdir()
    Streams(monkeypatch)
    monkeypatch.setattr(status, "AWAIT_RUN_S", 0.2)
    with pytest.raises(status.AgentError, match="job_20260101_000000"):
        status.cmd_logs(str(tmp_path), "job_20260101_000000", 0, None, True, await_run=True)
    with pytest.raises(status.AgentError):  # a path is never looked for
        status.cmd_logs(str(tmp_path), "../x", 0, None, True, await_run=True)


def test_a_long_log_costs_the_host_a_chunk_of_memory_not_its_size(tmp_path: Path) -> None:
    """A whole log asked for (a follow resumed far behind: a laptop that slept through a chatty job's night),
    read and sent a piece at a time: the agent's peak memory is its own and a piece's, not the log's (read
    in one piece, 64 MiB of log cost 64 MiB more)."""
    d = _run(tmp_path, "succeeded")
    block = b"".join(b"step %06d loss 0.5\n" % i for i in range(4096))
    with open(d / "log", "wb") as f:
        for _ in range(64 * 2**20 // len(block)):
            f.write(block)
    size = (d / "log").stat().st_size
    peak = "print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0], file=sys.stderr)"  # (KiB; this process's own)
    root = Path(__file__).resolve().parents[2]

    def agent(call: str) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            [sys.executable, "-c", f"import sys\nfrom agent import status\n{call}\n{peak}"], cwd=root, capture_output=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    done = agent(f"status.cmd_logs({str(tmp_path)!r}, {d.name!r}, 0, None, True)")
    assert len(done.stdout) == size and done.stdout.endswith(block)
    grew = int(done.stderr.split()[-1]) - int(agent("").stderr.split()[-1])
    assert grew < 16 * 1024, f"{grew} KiB more than the agent's own"
