"""A container run's unit on a real systemd (systemd 252, the guest's): systemd-run takes the unit's
ExecStopPost commands, which run on `systemctl stop` and at an orderly power-off: the container's stop
and removal by name (agent/units.py), whatever killed the `docker run` client. systemd runs them as soon
as the main process (screen) is gone, while the job may still be saving: this test found that, and so the
first command waits for the job as `docker stop --time GRACE` does. (The guest has no Docker: stand-in
commands wait the same way and record what they saw.)"""

from __future__ import annotations

import shlex

from agent import units


def test_the_units_stop_removes_the_container_after_its_processes_end(make_guest) -> None:
    guest = make_guest()
    guest.boot()
    marker = "/var/tmp/container-removed"
    # The "client": saves for 2 s on SIGTERM, as a `docker run` passing it on to its job (and, as the wrapper,
    # outliving screen's SIGHUP).
    client = [
        "/bin/bash",
        "-c",
        "trap '' HUP; trap 'sleep 2; echo saved > /var/tmp/client-saved; exit 0' TERM; while :; do sleep 0.1; done",
    ]
    # Stands in for `docker stop --time 10 NAME` then `docker rm`: it waits for the job, as docker stop does.
    wait = "for i in $(seq 100); do [ -e /var/tmp/client-saved ] && break; sleep 0.1; done"
    post = [["/bin/sh", "-c", wait], ["/bin/sh", "-c", f"cat /var/tmp/client-saved > {marker} 2>&1; date >> {marker}"]]
    argv = units.systemd_run_argv("c_1", guest.user, 10, client, {"PATH": "/usr/bin:/bin"}, "/usr/bin/screen", post)
    guest.sh(shlex.join(argv))
    guest.sh("for i in $(seq 100); do systemctl is-active -q gpu-train-c_1.service && exit 0; sleep 0.1; done; exit 1")
    shown = guest.sh("systemctl show -P ExecStopPost gpu-train-c_1.service").stdout
    assert "container-removed" in shown, shown
    guest.sh("systemctl stop gpu-train-c_1.service", timeout=30)
    said = guest.sh(f"cat {marker}").stdout.splitlines()
    assert said[0] == "saved", said  # after the client's own end (its grace), not before

    # At power-off: the unit stops (SIGTERM, its grace), then its ExecStopPost runs, before the guest is down.
    guest.sh(f"rm -f {marker} /var/tmp/client-saved")
    argv = units.systemd_run_argv("c_2", guest.user, 10, client, {"PATH": "/usr/bin:/bin"}, "/usr/bin/screen", post)
    guest.sh(shlex.join(argv))
    guest.sh("for i in $(seq 100); do systemctl is-active -q gpu-train-c_2.service && exit 0; sleep 0.1; done; exit 1")
    guest.power_off()
    assert guest.path(marker).read_text().splitlines()[0] == "saved"
