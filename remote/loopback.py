"""A throwaway OpenSSH server on loopback, as the current user (the demo, the tests, the benchmarks).

Several can run at once on 127.0.0.2, 127.0.0.3, ... (all of 127/8 is loopback).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        port: int = s.getsockname()[1]
        return port


def keygen(path: Path) -> Path:
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpu-train-test", "-f", str(path)], check=True)
    return path


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (sshd's per-connection children and their shells)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def sets(setenv: str, name: str) -> bool:
    """Whether SetEnv's ``NAME=VALUE ...`` text sets ``name`` itself (CUDA_HOME= is not HOME=)."""
    return any(word.startswith(name + "=") for word in setenv.split())


class Sshd:
    def __init__(
        self,
        workdir: Path,
        address: str = "127.0.0.2",
        client_key: Path | None = None,
        port: int | None = None,
        extra_config: str = "",
        prefix: tuple[str, ...] = (),
        setenv: str = "",
        max_sessions: int = 50,
        log_level: str = "ERROR",
        own_home: bool = True,
        quick_kex: bool = True,
        one_thread: bool = True,
    ):
        """``extra_config``: more sshd_config lines; ``max_sessions``: channels per connection (a stock
        sshd's: 10); ``log_level``: INFO logs each login in sshd.log; ``setenv``: more NAME=VALUE for the sessions (sshd
        takes the first SetEnv line only, so they join ours); ``prefix``: a command sshd runs under (a
        test may give a node its own mount namespace, as a VM has its own disk).

        ``own_home``: the login shell's HOME is a folder of this server's, as a fresh VM's user starts
        with, not this machine's dotfiles (a ~/.bashrc that runs `pyenv init`, as this workplace's does,
        costs every command sshd runs 0.1 s of CPU); its .bashrc and .zshenv only change to it, since sshd
        starts every session in the user's real home (a `~/x` on an rsync command line and the agent's
        `~` then mean the same folder; a login shell that reads neither stays where sshd put it). False
        keeps the real HOME.

        ``quick_kex``: key exchange by X25519 alone (OpenSSH 9's default, a post-quantum hybrid, costs
        both ends 0.1 s of CPU per connection, and nothing gpu-train does depends on which is agreed);
        False offers OpenSSH's default, as a real host does (the benchmarks).

        ``one_thread``: the sessions' OMP_NUM_THREADS=1, for the tests (below); False for a user's own jobs.
        """
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.address = address
        self.port = port or free_port(address)
        self.extra_config, self.prefix, self.setenv = extra_config, prefix, setenv
        self.max_sessions, self.log_level, self.quick_kex = max_sessions, log_level, quick_kex
        self.one_thread = one_thread
        if own_home and not sets(setenv, "HOME"):
            home = self.dir / "home"
            home.mkdir(mode=0o700, exist_ok=True)
            for rc in (".bashrc", ".zshenv"):
                (home / rc).write_text('cd "$HOME"\n')
            self.setenv = f"HOME={home} {setenv}".strip()
        self.user = getpass.getuser()
        self.client_key = client_key or keygen(self.dir / "client_ed25519")
        self.host_key = keygen(self.dir / "host_ed25519")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def spec(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"

    def new_host_key(self) -> None:
        """Replace the host key (a rebuilt host, or an impostor); takes effect on the next start."""
        for p in (self.host_key, self.host_key.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        keygen(self.host_key)

    def start(self) -> Sshd:
        (self.dir / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        config = self.dir / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress {self.address}\nHostKey {self.host_key}\nPidFile {self.dir}/sshd.pid\n"
            f"AuthorizedKeysFile {self.dir}/authorized_keys\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin prohibit-password\n"
            "Subsystem sftp internal-sftp\nMaxStartups 100\nPrintMotd no\n"
            f"MaxSessions {self.max_sessions}\nLogLevel {self.log_level}\n"
            "AllowTcpForwarding yes\nPermitUserEnvironment no\nAcceptEnv LANG\n"
            + ("KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org\n" if self.quick_kex else "")
            # A login shell that runs `pyenv init` (this workplace's ~/.bashrc) would wait up to 60 s on a
            # rehash lock left behind when a test kills a session mid-rehash: do not wait for it.
            # The agent adds a cluster's key where this sshd reads keys (agent/cluster.py), not
            # into the login user's real ~/.ssh/authorized_keys.
            # A CPU torch job here shares a few cores with everything else (the tests beside it): with
            # one OpenMP thread it does not spin against them (the example's 600 steps under load: 54 s -> 17 s).
            + f"SetEnv PYENV_REHASH_TIMEOUT=0 {'OMP_NUM_THREADS=1 ' if self.one_thread else ''}{self._keys_env()}{self.setenv}\n"
            + self.extra_config
        )
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
        pid_file = self.dir / "sshd.pid"
        pid_file.unlink(missing_ok=True)
        with open(self.dir / "sshd.log", "ab") as log:
            self.proc = subprocess.Popen(
                [*self.prefix, SSHD, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.dir / 'sshd.log').read_text()}")
            # Ours is up once it wrote its pid file, which sshd does after binding: a connection alone
            # may reach another listener still on the address (a server of a test before, going away).
            try:
                if pid_file.read_text().strip() == str(self.proc.pid):
                    with socket.create_connection((self.address, self.port), timeout=0.5):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("sshd did not start listening")

    def _keys_env(self) -> str:
        return "" if sets(self.setenv, "GPU_TRAIN_AUTHORIZED_KEYS") else f"GPU_TRAIN_AUTHORIZED_KEYS={self.dir}/authorized_keys "

    def stop(self) -> None:
        """Kill the daemon and every session it serves (as a crash or a network cut would)."""
        if self.proc is None:
            return
        victims = [self.proc.pid, *descendants(self.proc.pid)]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    def stack_file(self, stacks_dir: Path, name: str, remote_root: Path, python: str, extra: str = "") -> Path:
        """An SSH stack pointing at this server."""
        stacks_dir.mkdir(parents=True, exist_ok=True)
        path = stacks_dir / f"Pulumi.{name}.yaml"
        path.write_text(
            "config:\n  gpu-train:target: ssh\n"
            f"  gpu-train:hosts: ['{self.spec}']\n  gpu-train:sshKey: {self.client_key}\n"
            f"  gpu-train:remoteRoot: {remote_root}\n  gpu-train:python: {python}\n"
            "  gpu-train:venv: false\n"  # the job runs with ``python`` as it is (the tests' own, with torch)
            f"{extra}"
        )
        return path


def stack_text(server: Sshd, remote_root: Path) -> str:
    """The stack file lines that reach ``server`` (an SSH stack on this machine)."""
    return (
        "config:\n  gpu-train:target: ssh\n"
        f"  gpu-train:hosts: ['{server.spec}']\n  gpu-train:sshKey: {server.client_key}\n"
        f"  gpu-train:remoteRoot: {remote_root}\n"
    )


def your_python_env(environ: dict[str, str] | None = None, home: Path | None = None) -> str:
    """SetEnv words that keep this user's python3 in sessions whose HOME is the server's own: PATH, and
    PYENV_ROOT (pyenv's shims look for it under $HOME otherwise). Values with spaces are left out."""
    environ = dict(os.environ) if environ is None else environ
    pyenv = environ.get("PYENV_ROOT") or (str((home or Path.home()) / ".pyenv") if ((home or Path.home()) / ".pyenv").is_dir() else "")
    words = {"PATH": environ.get("PATH", ""), "PYENV_ROOT": pyenv}
    return " ".join(f"{k}={v}" for k, v in words.items() if v and not any(c.isspace() or c in "\"'" for c in v))


def main(argv: list[str] | None = None) -> int:
    """`python -m remote.loopback`: an SSH stack to try gpu-train on, with no other machine.

    Starts sshd on a loopback address as you, prints the stack lines that reach it, and serves
    until Ctrl-C. Its keys live in --dir, so the next start is the same host (the stack's learned
    host key still matches) on the same port when it is free.
    """
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m remote.loopback",
        description="a throwaway sshd on loopback: prints the stack lines that reach it, serves until Ctrl-C",
    )
    p.add_argument("--address", default="127.0.0.2", help="a loopback address (127.x.y.z; default 127.0.0.2)")
    p.add_argument("--port", type=int, default=2222, help="default 2222, or a free one when it is taken")
    p.add_argument(
        "--dir",
        type=Path,
        default=Path("~/.cache/gpu-train/loopback").expanduser(),
        help="where its keys, config and the host's files (remoteRoot) live",
    )
    args = p.parse_args(argv)
    if not args.address.startswith("127."):
        p.error(
            f"--address {args.address}: give a loopback address (127.x.y.z): this sshd lets in your key only, "
            "but it should not listen on a network"
        )
    port = args.port
    with socket.socket() as s:
        try:
            s.bind((args.address, port))
        except OSError:
            port = free_port(args.address)
    workdir = args.dir.expanduser().resolve() / f"{args.address}"
    # Your machine, with a home of its own: a stack made by `init --host` (remoteRoot ~/.gpu-train) keeps its runs
    # in WORKDIR/home, not in your real home; your PATH (and pyenv's root), so python3 is the one your shell has;
    # your jobs' own threads (no OMP_NUM_THREADS=1, which the tests' hosts set).
    server = Sshd(workdir, args.address, port=port, quick_kex=False, one_thread=False, setenv=your_python_env()).start()
    # `kill` (SIGTERM), as from a job control or a test, stops the sshd too, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        print(
            f"sshd on {args.address}:{port} as {server.user}, files in {workdir}; Ctrl-C stops it.\n"
            "Put these lines in your project's stacks/Pulumi.local.yaml:\n",
            flush=True,
        )
        print(stack_text(server, workdir / "remote"), flush=True)
        print(
            "then: gpu-train ssh --stack local -- uname -a; gpu-train train --stack local --script train.py --follow\n"
            "(the job's venv is made from your python3 with its site packages; its login's home is "
            f"{workdir / 'home'}, so a stack from `gpu-train init --host {server.spec}` keeps its runs there too)",
            flush=True,
        )
        while server.proc is not None and server.proc.poll() is None:
            time.sleep(0.5)
        print("sshd exited: see " + str(workdir / "sshd.log"), flush=True)
        return 1
    except KeyboardInterrupt:
        print("stopped", flush=True)
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
