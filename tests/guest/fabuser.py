"""A user of a booted guest: the real `fab` executable over SSH, on a stack pointing at the guest.

The guest plays a Compute Engine VM: its startup script comes from the program's metadata (run by
the stand-in google-startup-scripts unit); the user reaches it as an SSH stack on the guest's
loopback sshd. Run state is read from the guest's disk, as the agent wrote it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT
from tests.guest.harness import Guest

FAB = str(Path(sys.executable).parent / "fab")
EXAMPLE = ROOT / "examples"


class FabUser:
    def __init__(self, tmp: Path, guest: Guest, key_file: Path, remote_root: str = "~/gpu-train", extra: str = ""):
        self.tmp, self.guest = tmp, guest
        self.stacks, self.home, self.cwd = tmp / "stacks", tmp / "home", tmp / "work"
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.remote_root, self.key_file = remote_root, key_file
        self.restack(extra)

    def restack(self, extra: str = "") -> None:
        """(Re)write the user's stack file, with ``extra`` settings lines (``  gpu-train:KEY: VALUE``)."""
        # the guest stands in for a GCP VM, where jobs run in the host's Python (venv: false)
        self.guest.ssh_stack(self.stacks, "vm", self.key_file, self.remote_root, "  gpu-train:venv: false\n" + extra)

    @property
    def root(self) -> Path:
        """REMOTE_ROOT as seen from outside the guest."""
        inside = self.remote_root.replace("~", f"/home/{self.guest.user}", 1)
        return self.guest.path(inside)

    def fab(self, *args: str, check: bool = False, timeout: float = 180) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "GPU_TRAIN_STACKS_DIR": str(self.stacks),
            "GPU_TRAIN_HOME": str(self.home),
            "GPU_TRAIN_STACK": "vm",
            "PYTHONPATH": str(ROOT),
        }
        result = subprocess.run(
            [FAB, "--search-root", str(ROOT), *args],
            env=env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"fab {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def end_shared_connection(self) -> None:
        """Close the shared OpenSSH connection the tasks left (remote/ssh/mux.py): an SSH session on the
        host, which the idle clock waits for (60 s at most, its ControlPersist)."""

        from gpu_train.environment import Environment
        from remote.ssh import mux
        from remote.ssh.target import resolve

        env = {"GPU_TRAIN_STACKS_DIR": str(self.stacks), "GPU_TRAIN_HOME": str(self.home), "GPU_TRAIN_STACK": "vm"}
        target = resolve(Environment.from_os(env), "vm").for_node(0)
        mux.end_master(target, target.host)

    def train(self, *args: str) -> str:
        out = self.fab("train", *args, check=True).stdout
        return out.split()[1]  # "started RUN_ID on ..."

    def state(self, run: str) -> dict:
        try:
            return json.loads((self.root / "runs" / run / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def log(self, run: str) -> str:
        try:
            return (self.root / "runs" / run / "log").read_text(errors="replace")
        except OSError:
            return ""

    def status(self) -> dict:
        # every project's runs: two FabUsers are two laptops (two project ids) looking at one VM's runs
        return json.loads(self.fab("status", "--json", "--all-projects", check=True).stdout)

    def run_status(self, run: str) -> dict:
        return next(r for r in self.status()["runs"] if r["id"] == run)

    def wait_for(self, what: str, test, timeout: float = 120, every: float = 0.3):
        """Poll ``test()`` until it is truthy; its value. The guest's journal on a timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = test()
            if value:
                return value
            time.sleep(every)
        raise AssertionError(f"timed out waiting for {what}\n--- journal ---\n{self.guest.journal()[-6000:]}")

    def wait_state(self, run: str, states: tuple[str, ...], timeout: float = 120) -> dict:
        return self.wait_for(f"{run} in {states}", lambda: (s := self.state(run)).get("state") in states and s, timeout)

    def wait_step(self, run: str, step: int, timeout: float = 120) -> int:
        return self.wait_for(f"{run} at step {step}", lambda: (s := last_step(self.log(run))) >= step and s, timeout)


def last_step(log: str) -> int:
    steps = [int(m) for m in re.findall(r"^step (\d+) loss", log, re.M)]
    return steps[-1] if steps else 0
