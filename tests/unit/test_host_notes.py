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


def test_two_projects_changing_the_crontab_at_once_keep_both_lines(tmp_path: Path) -> None:
    """The crontab is one per user, read, edited and written whole: two REMOTE_ROOTs' changes at once (two
    projects set up together) kept only the last one's lines. A `crontab` on PATH that waits between the
    read and the write makes every change overlap; each root's line is still there after."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    table, bin_dir = tmp_path / "crontab.txt", tmp_path / "bin"
    bin_dir.mkdir()
    table.write_text("")
    (bin_dir / "crontab").write_text(
        f'#!/bin/sh\nif [ "$1" = -l ]; then cat {table}; else sleep 0.3; cat > {table}.new; mv {table}.new {table}; fi\n'
    )
    (bin_dir / "crontab").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    code = "import sys; from agent import hostcheck; hostcheck.set_cron(sys.argv[1], ['@reboot boot ' + hostcheck.cron_tag(sys.argv[1])])"
    procs = [subprocess.Popen([sys.executable, "-c", code, f"/roots/r{i}"], env=env) for i in range(4)]
    assert [p.wait(60) for p in procs] == [0] * 4
    assert sorted(table.read_text().split("\n")[:-1]) == [f"@reboot boot # gpu-train /roots/r{i}" for i in range(4)]
