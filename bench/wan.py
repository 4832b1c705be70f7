"""fab over a slow network: a TCP proxy adds 50 ms each way (100 ms round trip) to a loopback sshd.

Targets (issue: Run training on the VM with Fabric): `fab status` <= 1.3 s and `fab train` with
unchanged code <= 1.8 s end to end; `fab --list` <= 0.4 s. Printed against `ssh host true` through
the same proxy (what one bare round of OpenSSH costs there).

Run: .venv/bin/python bench/wan.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from remote.loopback import Sshd, free_port  # noqa: E402

FAB = str(Path(sys.executable).parent / "fab")
DELAY = 0.050


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy bytes, each chunk delivered DELAY seconds after it arrived, in order."""
    queue: asyncio.Queue = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if data is None:
                writer.close()
                return
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()

    task = asyncio.create_task(deliver())
    while data := await reader.read(65536):
        queue.put_nowait((time.monotonic() + DELAY, data))
    queue.put_nowait((0, None))
    await task


def start_proxy(listen: tuple[str, int], upstream: tuple[str, int]) -> None:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection(*upstream)
        await asyncio.gather(_pipe(r, uw), _pipe(ur, w), return_exceptions=True)

    async def serve() -> None:
        server = await asyncio.start_server(handle, *listen)
        async with server:
            await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(serve()), daemon=True).start()


def timed(cmd: list[str], env: dict, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, stdin=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
        time.sleep(1.0)  # a new second: a new run id for train
    return statistics.median(times)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sshd = Sshd(work / "sshd", "127.0.0.2", quick_kex=False).start()  # key exchange as a real host offers
        proxy = ("127.0.0.3", free_port("127.0.0.3"))
        start_proxy(proxy, (sshd.address, sshd.port))
        time.sleep(0.2)
        sshd.address, sshd.port = proxy  # the stack names the proxy
        sshd.stack_file(work / "stacks", "wan", work / "host", sys.executable)
        env = {**os.environ, "GPU_TRAIN_STACKS_DIR": str(work / "stacks"), "GPU_TRAIN_HOME": str(work / "state"), "GPU_TRAIN_STACK": "wan"}
        code = work / "code"
        code.mkdir()
        for i in range(50):
            (code / f"m{i}.py").write_text("x = 1\n" * 50)
        train = [FAB, "train", "--dir", str(code), "--command", "true", "--name", "bench"]
        subprocess.run(train, env=env, cwd=ROOT, check=True, capture_output=True)  # learns the host key
        ssh = [
            "ssh",
            "-p",
            str(proxy[1]),
            "-i",
            str(sshd.client_key),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            f"{sshd.user}@{proxy[0]}",
            "true",
        ]
        bare = timed(ssh, env)
        listing = timed([FAB, "--list"], env)
        status = timed([FAB, "status"], env)
        unchanged = timed(train, env)
        sshd.stop()
    print(f"network: +{DELAY * 1000:.0f} ms each way through a TCP proxy; medians of 5")
    print(f"  ssh host true (one bare OpenSSH login):   {bare:5.2f} s")
    print(f"  fab --list                                {listing:5.2f} s  target <= 0.4 s  ratio to target {listing / 0.4:.2f}")
    print(
        f"  fab status                                {status:5.2f} s  target <= 1.3 s  ratio to target {status / 1.3:.2f}"
        f"  ({status / bare:.2f}x ssh true)"
    )
    print(
        f"  fab train, unchanged code (50 files)      {unchanged:5.2f} s  target <= 1.8 s  ratio to target "
        f"{unchanged / 1.8:.2f}  ({unchanged / bare:.2f}x ssh true)"
    )


if __name__ == "__main__":
    main()
