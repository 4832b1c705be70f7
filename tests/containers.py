"""A real Docker daemon and registry for the container tests, never the internet.

``Dockerd`` starts Debian's dockerd with its own data root, exec root, pidfile and socket, no
iptables and no bridge (containers use the host network, as gpu-train's do), as root. Images come
from ``docker import`` of the guest tier's Debian root file system (tests/guest/rootfs.py builds it:
Python 3.11, bash), plus what a job needs, given as Dockerfile-like changes. ``Registry`` is Debian's
docker-registry on a loopback port with htpasswd authentication (Docker trusts 127.0.0.0/8 as an
insecure registry by default).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from tests.guest.rootfs import ROOTFS

DOCKERD = shutil.which("dockerd") or "/usr/sbin/dockerd"
# Debian's client beside its daemon (a newer one earlier on PATH works too; the tests pin this one)
DOCKER = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else shutil.which("docker") or "docker"
REGISTRY = shutil.which("docker-registry") or "/usr/bin/docker-registry"
# What the base image leaves out of the root file system (docs, locales, the guest's systemd units)
SLIM = ("./usr/share/doc", "./usr/share/man", "./usr/share/locale", "./var/cache/apt", "./var/lib/apt/lists")


def skip_reason() -> str | None:
    """Why the container tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "the container tests start their own dockerd: root only (scripts/test runs them as root)"
    for tool, package in ((DOCKERD, "docker.io"), (DOCKER, "docker.io")):
        if not os.path.exists(tool) and not shutil.which(tool):
            return f"{tool} is missing: apt-get install {package} (scripts/test does, as root)"
    if not (ROOTFS / "usr" / "bin" / "python3").exists():
        return f"no Debian root file system at {ROOTFS} to import as an image: python -m tests.guest.harness build"
    return None


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Dockerd:
    """A dockerd of the test's own (socket ``DOCKER_HOST``), stopped with ``stop``."""

    def __init__(self, base: Path, data_root: Path | None = None):
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.data_root = data_root or base / "data"
        # containerd's socket lives under the exec root: a short path (a socket's path is at most 107 bytes)
        self.exec_root = Path(tempfile.mkdtemp(prefix="gtd-", dir="/tmp"))
        self.socket = base / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.log = base / "dockerd.log"
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def start(self, timeout: float = 60) -> Dockerd:
        argv = [
            DOCKERD,
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            f"--data-root={self.data_root}",
            f"--exec-root={self.exec_root}",
            f"--pidfile={self.base / 'dockerd.pid'}",
            f"--host={self.host}",
            "--default-ulimit=nofile=1024:1024",
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            if self.docker("version", check=False).returncode == 0:
                return self
            time.sleep(0.1)
        raise RuntimeError(f"dockerd did not answer in {timeout} s: {self.log.read_text()[-2000:]}")

    def docker(self, *args: str, check: bool = True, input: bytes | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        said = subprocess.run([DOCKER, *args], env=self.env, capture_output=True, input=input, timeout=timeout)
        if check and said.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)}: {said.stderr.decode(errors='replace')[-2000:]}")
        return said

    def out(self, *args: str) -> str:
        return self.docker(*args).stdout.decode().strip()

    def import_rootfs(self, tag: str, changes: tuple[str, ...] = ()) -> str:
        """``docker import`` of the Debian root file system (less docs and locales) as ``tag``, with
        Dockerfile ``changes`` (ENTRYPOINT, CMD, USER, ...); its image ID."""
        tar = subprocess.Popen(["tar", "-C", str(ROOTFS), *(f"--exclude={p}" for p in SLIM), "-c", "."], stdout=subprocess.PIPE)
        flags = [f"--change={c}" for c in changes]
        said = subprocess.run([DOCKER, "import", *flags, "-", tag], stdin=tar.stdout, env=self.env, capture_output=True, timeout=300)
        tar.wait()
        if said.returncode != 0:
            raise RuntimeError(f"docker import {tag}: {said.stderr.decode(errors='replace')}")
        return self.out("image", "inspect", "--format", "{{.Id}}", tag)

    def derive(self, base: str, tag: str, extra: dict[str, str], changes: tuple[str, ...] = ()) -> str:
        """A layer of ``extra`` files over ``base`` (docker commit of a container that wrote them)."""
        name = f"derive-{os.getpid()}-{time.monotonic_ns()}"
        script = "".join(f"mkdir -p $(dirname {p}) && printf %s {_quote(t)} > {p} && chmod 755 {p}; " for p, t in extra.items())
        self.docker("run", "--network", "host", "--user", "0", "--name", name, "--entrypoint", "/bin/sh", base, "-c", script)
        try:
            self.docker("commit", *(f"--change={c}" for c in changes), name, tag)
        finally:
            self.docker("rm", "-f", name, check=False)
        return self.out("image", "inspect", "--format", "{{.Id}}", tag)

    def names(self) -> list[str]:
        """The containers there are (running or not)."""
        return self.out("ps", "-a", "--format", "{{.Names}}").split()

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(Exception):
            ids = self.out("ps", "-aq").split()
            if ids:
                self.docker("rm", "-f", *ids, check=False, timeout=60)
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        for left in (self.exec_root / "netns" / "default", self.exec_root, self.data_root):  # what dockerd leaves mounted
            subprocess.run(["umount", "-l", str(left)], capture_output=True, check=False)
        shutil.rmtree(self.exec_root, ignore_errors=True)
        self.proc = None


class StartCut:
    """A socket in front of a dockerd's (``host``: give it as DOCKER_HOST) that passes every request but
    the first start of a container (``POST /vN/containers/ID/start``): there the client that sent it is
    killed (SIGKILL, its pid from the socket's peer credentials) and the request never reaches the
    daemon, so the container stays as the client left it, created and never started. ``seen`` runs
    first with the container's id (or name) as the request names it; ``killed`` is the client's pid."""

    START = re.compile(rb"POST /v[\d.]+/containers/([^/\s]+)/start")

    def __init__(self, daemon: Dockerd, seen: Callable[[str], None] = lambda container: None):
        self.base = Path(tempfile.mkdtemp(prefix="gtc-", dir="/tmp"))  # (a socket's path: 107 bytes at most)
        self.path, self.upstream, self.seen = self.base / "cut.sock", str(daemon.socket), seen
        self.host = f"unix://{self.path}"
        self.killed: int | None = None
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(self.path))
        self.server.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:  # closed
                return
            daemon = socket.socket(socket.AF_UNIX)
            daemon.connect(self.upstream)
            threading.Thread(target=self._pump, args=(client, daemon, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(daemon, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        tail = b""
        try:
            while chunk := src.recv(65536):
                if from_client and self.killed is None and (m := self.START.search(tail + chunk)):
                    pid = struct.unpack("3i", src.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
                    self.seen(m.group(1).decode())
                    os.kill(pid, signal.SIGKILL)
                    self.killed = pid
                    break
                tail = chunk[-200:]
                dst.sendall(chunk)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()
        shutil.rmtree(self.base, ignore_errors=True)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


class Registry:
    """Debian's docker-registry on ``address``, with one user (htpasswd, bcrypt) and its data in ``base``."""

    def __init__(self, base: Path, address: str, user: str = "puller", password: str = "s3cret-registry-token", log_level: str = "warn"):
        self.base, self.user, self.password = base, user, password
        base.mkdir(parents=True, exist_ok=True)
        self.port = free_port(address)
        self.host = f"{address}:{self.port}"
        self.proc: subprocess.Popen | None = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt  # (3.11: bcrypt through libxcrypt; the registry takes bcrypt only)

            hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
        (base / "htpasswd").write_text(f"{user}:{hashed}\n")
        (base / "config.yml").write_text(
            f"version: 0.1\nlog:\n  level: {log_level}\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {base / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\nauth:\n  htpasswd:\n    realm: gpu-train-tests\n    path: {base / 'htpasswd'}\n"
        )

    def start(self, timeout: float = 30) -> Registry:
        with open(self.base / "registry.log", "ab") as log:
            self.proc = subprocess.Popen([REGISTRY, "serve", str(self.base / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            address, port = self.host.rsplit(":", 1)
            with contextlib.suppress(OSError), socket.create_connection((address, int(port)), 0.5):
                return self
            time.sleep(0.1)
        raise RuntimeError(f"docker-registry did not listen on {self.host}")

    def push(self, dockerd: Dockerd, local: str, name: str) -> str:
        """``local`` pushed as HOST/NAME (logged in with a config of its own, removed after); its digest ref."""
        remote = f"{self.host}/{name}"
        with tempfile.TemporaryDirectory() as conf:
            env = {**dockerd.env, "DOCKER_CONFIG": conf}
            run = lambda *a, **k: subprocess.run([DOCKER, *a], env=env, capture_output=True, check=True, timeout=300, **k)  # noqa: E731
            run("login", "--username", self.user, "--password-stdin", self.host, input=self.password.encode())
            run("tag", local, remote)
            run("push", remote)
        digests = dockerd.out("image", "inspect", "--format", "{{json .RepoDigests}}", remote)
        return next(d for d in __import__("json").loads(digests) if d.startswith(self.host))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            self.proc = None
