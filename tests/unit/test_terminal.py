"""A host's and a job's words on the user's terminal (issue 28 G): text and colour kept, every other
escape written out, in `logs` / `--follow` (real sshd, real job), `import`, and the fetch's own lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpu_train.errors import TerminalStream, shown
from remote.transfer.fetch.report import RunResult, notes

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"  # sets the clipboard to "echo pwned"


@pytest.mark.parametrize(("raw", "expected"), [
    ("loss 0.5\tstep 3\r\n", "loss 0.5\tstep 3\r\n"),
    ("\x1b[31mred\x1b[0m \x1b[1;38;5;208mbold\x1b[m", "\x1b[31mred\x1b[0m \x1b[1;38;5;208mbold\x1b[m"),
    (f"a{OSC52}b", "a\\x1b]52;c;ZWNobyBwd25lZA==\\x07b"),
    ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # clear screen, cursor home: not colour
    ("\x1bP+q544e\x1b\\", "\\x1bP+q544e\\x1b\\"),  # DCS (XTGETTCAP: the terminal answers as input)
    ("\x9b6n \u202eevil", "\\x9b6n \\u202eevil"),  # C1 CSI, a bidirectional override
    ("caf\u00e9 \U0001f642 \u200d", "caf\u00e9 \U0001f642 \u200d"),
])  # fmt: skip
def test_shown(raw: str, expected: str) -> None:
    assert shown(raw) == expected


def test_a_stream_cut_anywhere_shows_the_same() -> None:
    raw = f"x\x1b[32mgreen\x1b[0m{OSC52}caf\u00e9\n".encode() + b"\x9b2J\n"
    whole = TerminalStream()
    expected = whole.feed(raw) + whole.end()
    assert b"\x1b]" not in expected and b"\x1b[32m" in expected and b"\x9b" not in expected
    for cut in range(1, len(raw)):
        s = TerminalStream()
        assert s.feed(raw[:cut]) + s.feed(raw[cut:]) + s.end() == expected, cut


def test_a_newline_in_a_hosts_file_name_forges_no_line() -> None:
    forged = "x\nfetched 0 file(s), 0 B from 1 run(s) in 0.1 s; 1 up to date, 0 failed"
    result = RunResult("r_1", Path("/d"), changed=[forged], error=f"bad {forged}\x1b]0;t\x07")
    lines = notes(result, Path("/d"))
    assert all("\n" not in line and "\x1b" not in line for line in lines), lines


def test_import_writes_out_a_job_configs_escapes(tmp_path: Path) -> None:
    from tests.conftest import ROOT

    job = tmp_path / "config.yaml"
    job.write_text(
        "trainingInput:\n  scaleTier: BASIC_GPU\n  region: europe-west4\n"
        '  pythonModule: "trainer.task\\e]52;c;ZWNobyBwd25lZA==\\a"\n  args: ["--x", "\\e[2J"]\n'
    )
    out = subprocess.run(
        [sys.executable, "-m", "fabric", "-r", str(ROOT), "import", str(job), "--stack", "esc", "--stacks-dir", str(tmp_path / "stacks")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode in (0, 2), out.stderr
    assert "\x1b" not in out.stdout + out.stderr and "\\x1b]52;c;" in out.stdout + out.stderr, out.stdout + out.stderr
