"""A host's and a job's words on the user's terminal (issue 28 G): text and colour kept, cursor moves and
erases dropped (tqdm's nested bars), every other escape written out, in `logs` / `--follow` (real sshd,
real job), status's LAST LINE, `import`, and the fetch's own lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpu_train.errors import TerminalStream, shown
from remote.transfer.fetch.report import RunResult, notes

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"  # sets the clipboard to "echo pwned"
# tqdm 4.70.1's bytes for an inner bar (position=1) under an outer one, to a file: each inner bar ends in
# ESC [ A (back up to the outer bar's line); the inner bar's end clears its line and backs up.
TQDM_NESTED = (
    "\repoch:   0%|          | 0/2 [00:00<?, ?it/s]\n"
    "\reval:  33%|#####     | 1/3 [00:00<00:00, 246723.76it/s]\x1b[A\n"
    "\r                                                            \x1b[A"
    "\repoch:  50%|#####     | 1/2 [00:00<00:00, 3300.00it/s]"
)


@pytest.mark.parametrize(("raw", "expected"), [
    ("loss 0.5\tstep 3\r\n", "loss 0.5\tstep 3\r\n"),
    ("\x1b[31mred\x1b[0m \x1b[1;38;5;208mbold\x1b[m", "\x1b[31mred\x1b[0m \x1b[1;38;5;208mbold\x1b[m"),
    (f"a{OSC52}b", "a\\x1b]52;c;ZWNobyBwd25lZA==\\x07b"),
    # cursor moves and erases are dropped: never sent, they can overwrite or hide nothing
    ("\x1b[2J\x1b[H", ""),  # clear screen, cursor home
    ("a\x1b[Ab\x1b[3Bc\x1b[12Cd\x1b[1De", "abcde"),  # up, down, forward, back
    ("bar\x1b[K \x1b[2K \x1b[0J \x1b[1E\x1b[2F\x1b[5G\x1b[3;7H\x1b[3;7f.", "bar   ."),  # erases; to a line, column, place
    (TQDM_NESTED, TQDM_NESTED.replace("\x1b[A", "")),
    # every other CSI is still written out: private modes, device status (answers as input), scrolls
    ("\x1b[?25l\x1b[?1049h", "\\x1b[?25l\\x1b[?1049h"),  # hide the cursor, the alternate screen
    ("\x1b[6n \x1b[5S \x1b[2:3A", "\\x1b[6n \\x1b[5S \\x1b[2:3A"),
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


def test_tqdms_nested_bars_read_as_bars_in_logs_and_last_line(tmp_path: Path) -> None:
    """A Hugging Face Trainer's eval bar under its training bar: real tqdm, two nested bars, into a file."""
    from tqdm import tqdm

    from agent import store
    from gpu_train import errors

    log = tmp_path / "log"
    with log.open("w") as f:
        for _ in tqdm(range(2), desc="epoch", file=f, ascii=True, mininterval=0, ncols=60):
            for _ in tqdm(range(3), desc="eval", file=f, ascii=True, leave=False, mininterval=0, position=1, ncols=60):
                pass
    raw = log.read_bytes()
    assert b"\x1b[A" in raw  # what the job wrote
    stream = TerminalStream()
    out = b"".join(stream.feed(raw[i : i + 7]) for i in range(0, len(raw), 7)) + stream.end()
    assert b"\x1b" not in out and b"\\x1b" not in out and b"eval: 100%|" in out and b"epoch: 100%|" in out
    # status's LAST LINE: the host's pick, before and after the inner bar's clear line
    assert store.last_line(str(log)).startswith("epoch: 100%|")
    cut = raw.rindex(b"\x1b[A") + len(b"\x1b[A")  # the log ends on the inner bar's clear line
    log.write_bytes(raw[:cut])
    assert store.last_line(str(log)).startswith("eval: 100%|")
    log.write_bytes(raw[: raw.index(b"\x1b[A") + 3])  # the log ends on the first inner bar
    first = store.last_line(str(log))
    assert first.startswith("eval:   0%|") and first.endswith("?it/s]"), first
    assert store.CURSOR_MOVES == errors.CURSOR_MOVES  # one policy on the host and the laptop


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
