"""Bulk transfers against the tools a user would otherwise type, on the same loopback sshd.

- fetch 1 GiB (4 files of 200 MiB and 1,000 of 200 KiB): `fab fetch` vs `rsync -a` and `scp -r`
  (target: ours / rsync <= 1.0), then a second fetch with nothing changed (target <= 0.5 s);
- sync of a 5,000-file code tree: `fab train`'s sync vs `rsync -a` (target <= 1.0), then a no-op
  re-sync (target <= 0.5 s).

Each side is timed end to end as a user runs it (a new process, its own connection), median of 3.
Run: .venv/bin/python bench/transfer.py
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from remote.loopback import Sshd  # noqa: E402

FAB = str(Path(sys.executable).parent / "fab")


def run(cmd: list[str], env: dict[str, Any], cwd: Path = ROOT) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t


def median(fn: Callable[[], float], n: int = 5) -> float:
    return float(statistics.median(fn() for _ in range(n)))


def paired(a: Callable[[], float], b: Callable[[], float], n: int = 5) -> tuple[float, float]:
    """Medians of ``a`` and ``b`` run alternately, so drift on a busy machine hits both alike."""
    ta, tb = [], []
    for _ in range(n):
        ta.append(a())
        tb.append(b())
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        sshd = Sshd(work / "sshd", "127.0.0.2", quick_kex=False).start()  # key exchange as a real host offers
        sshd.stack_file(work / "stacks", "bench", work / "host", sys.executable)
        env = {
            **os.environ,
            "GPU_TRAIN_STACKS_DIR": str(work / "stacks"),
            "GPU_TRAIN_HOME": str(work / "state"),
            "GPU_TRAIN_STACK": "bench",
        }
        ssh = [
            "ssh",
            "-p",
            str(sshd.port),
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
        ]
        remote = f"{sshd.user}@{sshd.address}"

        # A run whose JOB_DIR holds the 1 GiB.
        make = (
            "python3 -c \"import os; d=os.environ['JOB_DIR']; os.makedirs(d+'/small', exist_ok=True); "
            "[open(f'{d}/big{i}.bin','wb').write(os.urandom(200<<20)) for i in range(4)]; "
            "[open(f'{d}/small/s{i:04d}.bin','wb').write(os.urandom(200<<10)) for i in range(1000)]\""
        )
        out = subprocess.run(
            [FAB, "train", "--dir", str(ROOT / "examples"), "--command", make, "--name", "data"],
            env=env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        run_id = out.split()[1]
        job = work / "host" / "runs" / run_id / "job"
        while not (work / "host" / "runs" / run_id / "state.json").read_text().count('"succeeded"'):
            time.sleep(0.5)
        size = sum(p.stat().st_size for p in job.rglob("*") if p.is_file())

        def fresh(name: str) -> Path:
            d = work / name
            shutil.rmtree(d, ignore_errors=True)
            return d

        def ours() -> float:
            dest = fresh("ours")
            return run([FAB, "fetch", "--run", run_id, "--dest", str(dest)], env)

        def rsync() -> float:
            dest = fresh("rsync")
            return run(["rsync", "-a", "-e", " ".join(ssh), f"{remote}:{job}/", f"{dest}/"], env)

        def scp() -> float:
            dest = fresh("scp")
            return run(["scp", "-r", "-q", *["-P" if a == "-p" else a for a in ssh[1:]], f"{remote}:{job}", str(dest)], env)

        t_ours, t_rsync = paired(ours, rsync)
        t_scp = median(scp, 3)
        noop = median(lambda: run([FAB, "fetch", "--run", run_id, "--dest", str(work / "ours")], env))
        from gpu_train.environment import Environment
        from remote.tasks import fetch
        from remote.tasks import session as sessions

        def noop_in_process() -> float:
            t = time.perf_counter()
            session = sessions.Session(Environment.from_os(env), "bench")
            runs = session.call("status", "--summaries", "--run", run_id)["runs"]
            assert fetch.fetch_runs(session, runs, str(work / "ours"), False) == []
            session.close()
            return time.perf_counter() - t

        noop_inside = median(noop_in_process)
        print(f"fetch {size / 2**30:.2f} GiB (4 x 200 MiB + 1,000 x 200 KiB), medians of 5, alternating:")
        print(f"  fab fetch   {t_ours:6.2f} s  ({size / t_ours / 2**20:5.0f} MiB/s)")
        print(
            f"  rsync -a    {t_rsync:6.2f} s  ({size / t_rsync / 2**20:5.0f} MiB/s)   ours / rsync = {t_ours / t_rsync:.2f} (target <= 1.0)"
        )
        print(f"  scp -r      {t_scp:6.2f} s  ({size / t_scp / 2**20:5.0f} MiB/s)   ours / scp   = {t_ours / t_scp:.2f}")
        print(f"  fab fetch, nothing changed: {noop_inside:.2f} s (target <= 0.5 s); {noop:.2f} s with the fab process's start-up")

        # A 5,000-file code tree.
        code = work / "code"
        for i in range(5000):
            d = code / f"pkg{i // 100:02d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"mod{i:04d}.py").write_text(f"# module {i}\n" + "x = 1\n" * (i % 200 + 20))
        tree = sum(p.stat().st_size for p in code.rglob("*") if p.is_file())
        counter = iter(range(1000))

        def ours_sync() -> float:
            subprocess.run(["rm", "-rf", str(work / "host" / "code")], check=True)  # no earlier copy to reuse
            return run([FAB, "train", "--dir", str(code), "--command", "true", "--name", f"sync{next(counter)}"], env)

        def rsync_sync() -> float:
            fresh("rsync-code")
            return run(["rsync", "-a", "-e", " ".join(ssh), f"{code}/", f"{remote}:{work}/rsync-code/"], env)

        s_ours, s_rsync = paired(ours_sync, rsync_sync)
        name = "resync"
        run([FAB, "train", "--dir", str(code), "--command", "true", "--name", name], env)
        time.sleep(1.1)

        def noop_sync() -> float:
            t = run([FAB, "train", "--dir", str(code), "--command", "true", "--name", name], env)
            time.sleep(1.1)  # next run id
            return t

        s_noop = median(noop_sync)
        r_noop = median(lambda: run(["rsync", "-a", "-e", " ".join(ssh), f"{code}/", f"{remote}:{work}/rsync-code/"], env))
        sshd.stop()
    print(f"sync of a 5,000-file code tree ({tree / 2**20:.1f} MiB), medians of 5, alternating:")
    print(f"  fab train (sync + launch)   {s_ours:6.2f} s")
    print(f"  rsync -a                    {s_rsync:6.2f} s   ours / rsync = {s_ours / s_rsync:.2f} (target <= 1.0)")
    print(f"  fab train, code unchanged   {s_noop:6.2f} s   (no-op rsync -a: {r_noop:.2f} s; target <= 0.5 s)")


if __name__ == "__main__":
    main()
