"""What `train` says about the host after "started": GPUs already busy (nvidia-smi's compute apps),
other runs of ours still going, and on an SSH host whether a reboot resumes the run (the @reboot line
`setup` writes, a cron daemon to run it), which `down` takes away again."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import hostcheck
from tests.unit.test_resilience import crontab_restored  # noqa: F401  (the fixture)

T4 = {"index": 0, "name": "Tesla T4", "utilization": 0.0, "memoryUsedMiB": 0.0, "memoryTotalMiB": 15360.0}


@pytest.mark.parametrize(
    ("apps", "gpus", "runs", "words"),
    [
        ([], [T4], [], []),
        ([{"pid": 4242, "name": "python3", "memoryMiB": 10240.0}], [T4], [], ["in use by 1 process already: pid 4242 python3 (10240 MiB)"]),
        ([{"pid": p, "name": "python", "memoryMiB": None} for p in range(1, 7)], [T4], [], ["6 processes", "pid 4 python ..."]),
        ([], [{**T4, "utilization": 93.0}], [], ["GPU 0 is 93% busy with no process this user can see"]),
        ([], [T4], ["a_20250101_000000"], ["1 other run of gpu-train still running here: a_20250101_000000"]),
    ],
)
def test_busy_warnings(apps, gpus, runs, words) -> None:
    said = " | ".join(hostcheck.busy_warnings(apps, gpus, runs))
    assert all(w in said for w in words) and bool(said) == bool(words), said


@pytest.mark.parametrize(
    ("comms", "running"),
    [
        ({"1": "systemd", "200": "sshd"}, False),
        ({"1": "init", "77": "cron"}, True),
        ({"9": "crond"}, True),
        ({"9": "crontab"}, False),  # `crontab -e` open in an editor is not the daemon
    ],
)
def test_cron_running_reads_each_process_name(tmp_path: Path, comms: dict, running: bool) -> None:
    for pid, comm in comms.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "comm").write_text(comm + "\n")
    (tmp_path / "self").mkdir()  # not a pid
    assert hostcheck.cron_running(str(tmp_path)) == running
