"""The e2e tier of tests/unit/test_runlog.py (the same subject; its helpers are there)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from gpu_train.contract import RUN_FILES, RUN_LOG
from tests.conftest import Lab, after_the_second_of, run_fab

LAB_ADDRESS = "127.0.41.2"  # this module's loopback addresses: 127.0.41.x (the `lab` fixture reads it)


# A job that prints its loss curve: about 100 KB at once (past the size a fetch compares by blocks), then
# more lines for a few seconds (the log grows while a fetch reads it), and a file of its own named `log`.
JOB = (
    f'{sys.executable} -u -c "import os, time\n'
    "open(os.path.join(os.environ['JOB_DIR'], 'log'), 'w').write('the job\\'s own file\\n')\n"
    "for i in range(4000): print(f'step {i} loss {1 / (i + 1):.8f}')\n"
    "for i in range(4000, 4400): print(f'step {i} loss {1 / (i + 1):.8f}'); time.sleep(0.01)\n"
    "print('done')\""
)


def test_the_log_comes_home_with_every_fetch_while_it_grows(lab: Lab, plain: str) -> None:
    run = lab.train("--dir", plain, "--command", JOB, "--name", "curve")
    host_log = lab.remote / "runs" / run / "log"
    deadline = time.monotonic() + 60
    while "step 4000 " not in lab.log(run):
        assert time.monotonic() < deadline, lab.log(run)
        time.sleep(0.1)
    during = lab.fab("fetch", "--run", run)  # the job prints on meanwhile
    assert during.returncode == 0, during.stderr
    dest = lab.cwd / "runs" / "lab" / run
    home = dest / RUN_FILES / RUN_LOG
    early = home.read_bytes()
    assert len(early) > 100_000 and host_log.read_bytes().startswith(early)  # the start the host had
    assert f"its log (the job's stdout and stderr) -> {home}" in during.stderr

    assert lab.wait(run)["state"] == "succeeded", lab.log(run)
    done = lab.fab("fetch", "--run", run, check=True)
    assert home.read_bytes() == host_log.read_bytes() and b"done\n" in home.read_bytes(), done.stderr
    assert home.stat().st_mtime_ns == host_log.stat().st_mtime_ns
    assert not (dest / ".previous").exists()  # it grew: nothing of the laptop's copy was lost
    assert (dest / "log").read_text() == "the job's own file\n"  # JOB_DIR's `log`, untouched by the run's
    again = lab.fab("fetch", "--run", run, check=True)
    assert "its log" not in again.stderr and f"{run}: up to date" in again.stderr


def test_down_refuses_while_the_log_is_not_home(lab: Lab, plain: str) -> None:
    run = lab.train("--dir", plain, "--command", "echo 'Traceback: the only copy of it'; exit 3", "--name", "crash")
    assert lab.wait(run)["state"] == "failed"
    dest = lab.cwd / "runs" / "lab" / run
    dest.mkdir(parents=True)
    (dest / RUN_FILES).write_text("a file where the log's folder goes")
    refused = lab.fab("down")
    assert refused.returncode == 1 and "refusing: not everything is home" in refused.stderr
    assert f"{run}: its log: " in refused.stderr, refused.stderr
    (dest / RUN_FILES).unlink()
    lab.fab("down", check=True)
    assert "Traceback: the only copy of it" in (dest / RUN_FILES / RUN_LOG).read_text()


def test_a_resumed_runs_duration_counts_every_leg_and_not_the_wait(lab: Lab, plain: str) -> None:
    # The first leg waits for the stop (a 2 s leg could end first on a busy machine); the resumed one is short.
    legs_command = 'echo leg; if [ "$GPU_TRAIN_RESUMES" = 0 ]; then sleep 60; else sleep 2; fi; echo done'
    run = lab.train("--dir", plain, "--command", legs_command, "--name", "legs")
    state_file = lab.remote / "runs" / run / "state.json"
    deadline = time.monotonic() + 30
    while "leg" not in lab.log(run):
        assert time.monotonic() < deadline, lab.log(run)
        time.sleep(0.1)
    time.sleep(1)
    lab.fab("stop", "--run", run, "--grace", "1", check=True)
    first = json.loads(state_file.read_text())
    assert first["state"] == "stopped"
    time.sleep(3)  # stopped: not run time
    lab.fab("resume", "--run", run, check=True)
    assert lab.wait(run)["state"] == "succeeded", lab.log(run)
    second = json.loads(state_file.read_text())
    legs = (first["ended"] - first["started"]) + (second["ended"] - second["started"])
    shown = lab.run_state(run)["durationS"]
    assert abs(shown - legs) < 0.2, (shown, legs)  # both legs (the last alone is about 2 s)
    assert shown < second["ended"] - first["started"] - 2.5  # not the 3 s it waited
    assert "resumed 1x" in lab.fab("status", check=True).stdout


def test_a_log_that_grows_while_it_is_read_comes_home_as_listed_and_then_its_tail(host, tmp_path: Path) -> None:
    """Deterministic: the host's files grow between the listing and the reads. The log (an append-only
    source) comes home as far as it was listed; a JOB_DIR file that changed so is "changed while being
    read" as before. The next fetch sends the log's new end only."""
    from remote.transfer.fetch.engine import Fetcher
    from tests.fetch_host import MiB

    job = host.job()
    run_dir = job.parent
    (job / "metrics.jsonl").write_bytes(b"{}\n" * 1000)
    lines = b"".join(b"step %d loss %.8f\n" % (i, 1 / (i + 1)) for i in range(40_000))  # about 1 MiB
    (run_dir / "log").write_bytes(lines)

    class Growing(Fetcher):
        def _plan(self, results, listing):
            planned = super()._plan(results, listing)
            for path in (run_dir / "log", job / "metrics.jsonl"):  # the job prints on, after the listing
                with path.open("ab") as f:
                    f.write(b"step 40000 loss 0.00002500\n")
            return planned

    dest = tmp_path / "home"
    opener = host.opener()
    try:
        files, log = Growing(opener, 4).run([("r_1", dest), (f"r_1/{RUN_FILES}", dest / RUN_FILES)])
    finally:
        opener.close()
    assert log.complete and log.changed == [] and (dest / RUN_FILES / RUN_LOG).read_bytes() == lines
    assert files.changed == ["metrics.jsonl"]  # not an append-only source: as before
    [again] = host.run([(f"r_1/{RUN_FILES}", dest / RUN_FILES)])
    assert again.complete and (dest / RUN_FILES / RUN_LOG).read_bytes() == (run_dir / "log").read_bytes()
    assert again.bytes <= 2 * 64 * 1024 < MiB  # the new end (and the block it starts in), not the whole log
    assert not (dest / ".previous").exists() and not (dest.parent / ".previous").exists()


def test_logs_run_looks_in_this_projects_runs_first(lab: Lab, plain: str) -> None:
    """`logs --run NAME` reads this project's newest run of that name, as fetch, stop and resume do: it sent
    the agent no project, so another project's newer run of the same name answered, and an unknown name
    listed every project's runs."""
    mine = lab.train("--dir", plain, "--command", "echo mine", "--name", "job")
    other = lab.tmp / "other"
    other.mkdir()
    env = {**lab.env, "GPU_TRAIN_PROJECT": str(other)}
    after_the_second_of(mine)  # theirs: the newer run of the name
    theirs = run_fab(env, other, "train", "--dir", plain, "--command", "echo theirs", "--name", "job", check=True).stdout.split()[1]
    assert lab.wait(mine)["state"] == "succeeded", lab.log(mine)
    assert "theirs" in run_fab(env, other, "logs", "--follow", check=True).stdout  # (to its end)
    shown = lab.fab("logs", "--run", "job", check=True).stdout
    assert "mine" in shown and "theirs" not in shown, shown
    unknown = lab.fab("logs", "--run", "nope")
    assert f"runs here: {mine}" in unknown.stderr and theirs not in unknown.stderr, unknown.stderr
