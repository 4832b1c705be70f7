"""OS Login: the startup script sees it at once (no 3-minute wait for a user that never comes) and
says so; fab's refusal on a GCP stack names it. The script's block runs in real bash against a
throwaway /etc."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from remote.ssh import login
from remote.ssh.target import SshHost
from tests.conftest import ROOT

SCRIPT = (ROOT / "gpu_train" / "data" / "startup-script.sh.in").read_text()
BLOCK = SCRIPT[SCRIPT.index("# --- gpu-train: OS Login") : SCRIPT.index("# --- end of OS Login")]
NO_SUCH_USER = "gpu-train-no-such-user"


def run_block(etc: Path, user: str, wait: int = 90) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run(
        ["bash", "-c", BLOCK + '\nwait_for_user "$1" && echo present', "bash", user],
        env={"PATH": "/usr/bin:/bin", "GPU_TRAIN_ETC": str(etc), "GPU_TRAIN_USER_WAIT": str(wait)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result, time.monotonic() - started


@pytest.mark.parametrize(
    ("files", "user", "present", "words"),
    [
        ({"nsswitch.conf": "passwd:         files cache_oslogin oslogin\n"}, NO_SUCH_USER, False, "OS Login is on"),
        (
            {"ssh/sshd_config.d/oslogin.conf": "AuthorizedKeysCommand /usr/bin/google_authorized_keys\n"},
            NO_SUCH_USER,
            False,
            "OS Login is on",
        ),
        ({"nsswitch.conf": "passwd: files systemd\n"}, "root", True, ""),  # the user is there: go on
        ({"nsswitch.conf": "passwd: files cache_oslogin oslogin\n"}, "root", True, ""),
    ],
)
def test_the_startup_script_sees_os_login_at_once(tmp_path: Path, files: dict, user: str, present: bool, words: str) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    result, took = run_block(tmp_path, user)
    assert ("present" in result.stdout) == present
    assert words in result.stderr and took < 10  # not the 3-minute wait


def test_without_os_login_a_missing_user_is_waited_for_then_named(tmp_path: Path) -> None:
    (tmp_path / "nsswitch.conf").write_text("passwd: files\n")
    result, took = run_block(tmp_path, NO_SUCH_USER, wait=1)  # one look, then its 2 s wait
    assert result.returncode != 0 and f"the user {NO_SUCH_USER} did not appear" in result.stderr and took >= 2


def test_fab_names_os_login_when_a_gcp_key_is_refused(tmp_path: Path) -> None:
    assert login.OSLOGIN_MARK in SCRIPT  # the line fab points to is the one the script prints

    class T:  # the two fields refused_message reads
        key_file = str(tmp_path / "id_ed25519")
        is_gcp = True

    text = login.refused_message(T(), SshHost("trainer", "203.0.113.10"), Exception("Authentication failed."))
    assert "OS Login" in text and "get-serial-port-output" in text and login.OSLOGIN_MARK in text
    T.is_gcp = False
    assert "OS Login" not in login.refused_message(T(), SshHost("me", "lab"), Exception("Authentication failed."))
