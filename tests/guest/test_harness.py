"""The guest harness itself: a Debian guest boots under systemd-nspawn, runs the startup script the
program declares (fetched from the metadata server), lets the ssh-keys user in with passwordless
sudo, reads the metadata server the test flips, powers off in order and boots again."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import gcp_raw
from tests.guest.harness import METADATA_ENV, Guest, MetadataServer
from tests.guest.startup import startup_script_of


def ssh(guest: Guest, key: Path, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            "ssh",
            "-i",
            str(key),
            "-p",
            str(guest.port),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
            f"{guest.user}@{guest.address}",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_guest_boots_like_a_vm_and_powers_off_in_order(make_guest, metadata_server: MetadataServer, public_key: Path) -> None:
    guest = make_guest(startup_script_of(gcp_raw()))
    python = guest.add_python_with_torch()
    guest.boot()
    key = public_key.with_suffix("")
    assert ssh(guest, key, "sudo -n id -u").stdout.strip() == "0"  # google-sudoers: passwordless sudo
    assert guest.failed_units() == [], guest.journal()
    # Its own cgroups, as a VM has its own machine: guests booted side by side (-n 4) never share the
    # folders their units live in (they did, all under /payload, and one guest's shutdown broke another's units).
    cgroups = Path(f"/proc/{guest.init_pid}/cgroup").read_text().splitlines()
    assert [line for line in cgroups if line.endswith(f"/gpu-train-guests/{guest.name}/payload/init.scope")], cgroups
    # Where a Deep Learning VM has its conda: a Python with torch, for the user.
    assert guest.sh(f"{python} -c 'import torch; print(torch.__version__)'", user="trainer").stdout.startswith("2.")
    # The startup script came from the metadata server and installed the agent and its units.
    assert "instance/attributes/startup-script" in "".join(metadata_server.requests)
    assert guest.sh("systemctl is-enabled gpu-train-boot.service").stdout.strip() == "enabled"
    for installed in ("/usr/local/lib/gpu-train/gpu-train-agent", "/etc/gpu-train/agent.json"):  # root's, for the units
        st = guest.path(installed).stat()
        assert st.st_uid == 0 and not st.st_mode & 0o022, installed
    # Units in the guest find the metadata server through the agent's setting, and see it flip.
    read = (
        'systemd-run --wait --pipe -q python3 -c "import os, urllib.request as u; print(u.urlopen(u.Request('
        f"os.environ['{METADATA_ENV}'] + 'instance/preempted', headers={{'Metadata-Flavor': 'Google'}})).read().decode())\""
    )
    assert guest.sh(read).stdout.strip() == "FALSE"
    metadata_server.set("instance/preempted", "TRUE")
    assert guest.sh(read).stdout.strip() == "TRUE"
    assert guest.power_off() < 60
    assert not guest.up
    # A reboot: the same disk boots again and runs the startup script again.
    (guest.path("/home/trainer/marker")).write_text("kept")
    guest.boot()
    assert guest.sh("cat /home/trainer/marker").stdout == "kept"
    assert sum("startup-script" in r for r in metadata_server.requests) == 2


def test_cleanup_kills_the_whole_guest(make_guest, tmp_path: Path) -> None:
    guest = make_guest("#!/bin/bash\ntrue\n")
    guest.boot()
    init, nspawn = guest.init_pid, guest.proc.pid
    guest.cleanup()
    for pid in (init, nspawn):
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert not guest.root.exists() or not any(guest.root.iterdir())
