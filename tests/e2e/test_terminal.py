"""The e2e tier of tests/unit/test_terminal.py (the same subject; its helpers are there)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import Lab
from tests.unit.test_terminal import OSC52

LAB_ADDRESS = "127.0.10.9"  # 127.0.10.x: the hostile suites


def test_logs_and_follow_write_out_a_jobs_escapes(lab: Lab, plain: str) -> None:
    job = r"printf 'step 1 \033[32mok\033[0m\n\033]52;c;ZWNobyBwd25lZA==\007\033[2J done\n'"
    run = lab.fab("train", "--dir", plain, "--command", job, "--follow", check=True)
    assert "\x1b]" not in run.stdout and "\x1b[2J" not in run.stdout, run.stdout
    assert "\x1b[32mok\x1b[0m" in run.stdout and "\\x1b]52;c;ZWNobyBwd25lZA==\\x07 done" in run.stdout
    logs = lab.fab("logs", check=True)
    assert "\x1b]" not in logs.stdout and "\\x1b]52;c;" in logs.stdout and "\x1b[32mok" in logs.stdout


def test_tqdms_nested_bars_read_as_bars_in_logs_and_status(lab: Lab, plain: str) -> None:
    """A Trainer's eval bar under its training bar (tqdm's bytes, tests/unit/test_terminal.py): no `\\x1b[A`."""
    from tests.unit.test_terminal import TQDM_NESTED

    (Path(plain) / "bars.txt").write_text(TQDM_NESTED.replace("\repoch:  50%", "\reval:  67%") + "\x1b[A")
    run = lab.train("--command", "cat bars.txt", "--dir", plain)
    assert lab.wait(run)["state"] == "succeeded", lab.log(run)
    logs = lab.fab("logs", "--run", run, check=True).stdout
    assert "\x1b" not in logs and "\\x1b" not in logs and "eval:  33%|#####     | 1/3" in logs, logs
    row = next(line for line in lab.fab("status", check=True).stdout.splitlines() if run in line)
    assert row.rstrip().endswith("eval:  67%|#####     | 1/2 [00:00<00:00, 3300.00it/s]"), row


def test_nvidia_smi_writes_out_a_hosts_escapes(lab: Lab) -> None:
    from tests.e2e.test_lying_host import Liar

    lab.fab("status", check=True)
    liar = Liar(lab)
    liar.doc.write_text(f"| GPU 0 {OSC52} |\n")
    result = lab.fab("nvidia-smi")
    assert "\x1b" not in result.stdout + result.stderr and "| GPU 0 \\x1b]52;c;" in result.stdout, result.stdout
