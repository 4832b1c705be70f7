"""The e2e tier of tests/unit/test_terminal.py (the same subject; its helpers are there)."""

from __future__ import annotations

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


def test_nvidia_smi_writes_out_a_hosts_escapes(lab: Lab) -> None:
    from tests.e2e.test_lying_host import Liar

    lab.fab("status", check=True)
    liar = Liar(lab)
    liar.doc.write_text(f"| GPU 0 {OSC52} |\n")
    result = lab.fab("nvidia-smi")
    assert "\x1b" not in result.stdout + result.stderr and "| GPU 0 \\x1b]52;c;" in result.stdout, result.stdout
