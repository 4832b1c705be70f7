"""A real Cloud Storage emulator (gcp-storage-emulator, from PyPI) on loopback, for the bucket tests.

Google's clients find it through STORAGE_EMULATOR_HOST, with no setting of ours. Where it is kinder
than Cloud Storage (docs/bucket.md lists what was checked): it does not enforce generation
preconditions (ifGenerationMatch), so no test relies on a precondition failing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

EMULATOR = str(Path(sys.executable).parent / "gcp-storage-emulator")


def area(stack_file: Path) -> str:
    """The folder of its bucket a stack's runs go to, as gpu-train wrote it into the stack file at its first
    `train` with a bucket (gpu-train:bucketArea, STACK@XXXXXXXX)."""
    import yaml

    return str(yaml.safe_load(stack_file.read_text())["config"]["gpu-train:bucketArea"])


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Emulator:
    """The emulator with ``bucket`` made, in memory; ``url`` is STORAGE_EMULATOR_HOST's value."""

    def __init__(self, bucket: str, log: Path, threaded: bool = False):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.bucket_name = bucket
        self._log = open(log, "ab")  # noqa: SIM115 (closed in stop)
        # threaded: serving connections concurrently, as Cloud Storage does (bench/gcs_threaded.py; benchmarks only)
        command = [sys.executable, str(Path(__file__).resolve().parent.parent / "bench" / "gcs_threaded.py")] if threaded else [EMULATOR]
        self.proc = subprocess.Popen(
            [*command, "start", "--host", "127.0.0.1", "--port", str(self.port), "--in-memory", "--default-bucket", bucket, "--quiet"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"the storage emulator did not listen on {self.url} (see {log})")

    def client(self):
        from unittest import mock

        from google.cloud import storage

        with mock.patch.dict(os.environ, {"STORAGE_EMULATOR_HOST": self.url}):  # this emulator, directly
            return storage.Client()

    def objects(self, prefix: str = "") -> dict[str, bytes]:
        bucket = self.client().bucket(self.bucket_name)
        return {b.name: b.download_as_bytes() for b in bucket.list_blobs(prefix=prefix)}

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 9)
        self.proc.wait()
        self._log.close()


class Throttle:
    """A loopback TCP relay to the emulator that passes the client's bytes at ``rate`` bytes a second
    and counts them, so a test can stop an uploader in the middle of an upload (in memory on loopback,
    the emulator takes 100 MB in under a second)."""

    def __init__(self, target: int, rate: int):
        import threading

        self.target, self.rate, self.sent = target, rate, 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self._threading = threading
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self._threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            self._threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, slow: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(64 * 1024):
                dst.sendall(data)
                if slow:
                    self.sent += len(data)
                    time.sleep(len(data) / self.rate)
        for sock in (src, dst):  # one side gone: both go (the emulator waits for a body forever otherwise)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def wait_sent(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.sent < n:
            assert time.monotonic() < deadline, f"only {self.sent} bytes went through"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.close()
