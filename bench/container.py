"""A run in an image starts about as fast as a plain one; a re-pull of an unchanged image moves nothing.

Goals (issue 40): with the image present, `train --image` starts its job within 1 s of a plain `train`
of the same code (median over RUNS, same host); a second pull of an unchanged image transfers no layer.

The host is a loopback sshd (remote/loopback.py) and a dockerd this benchmark starts (tests/containers.py:
its own data root and socket, host network); the image is a `docker import` of the guest tier's Debian
root file system (python3), pushed to Debian's docker-registry on loopback with a password. Each time
runs from the `train` command to the job's first instant (the time the job writes into JOB_DIR), the code
sync included. The registry's own access log counts what the second pull asked for: manifests only,
no blob.

Beside them: the engine's own `docker run --rm` of the image (the floor of the overhead), and CPU seconds, the
laptop's (`train`) and the engine's (dockerd and containerd) per run. docs/testing.md has the latest numbers.

Run (root: it starts dockerd): flock /tmp/heavy.lock .venv/bin/python bench/container.py   (about 1 minute)
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from remote.loopback import Sshd  # noqa: E402
from tests import containers  # noqa: E402

GPU_TRAIN = str(Path(sys.executable).parent / "gpu-train")
RUNS = 7
JOB = "import os, time\nopen(os.path.join(os.environ['JOB_DIR'], 'started'), 'w').write(repr(time.time()))\n"


def cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) these processes have used so far."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def laptop_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def start_time(gt: Callable[..., subprocess.CompletedProcess[str]], remote: Path, *flags: str) -> float:
    """Seconds from `train` to the job's first instant."""
    time.sleep(1.02 - time.time() % 1)  # run ids are to the second: a new second, so that no two runs share one
    t = time.time()
    out = gt("train", "--script", "job.py", *flags).stdout
    run = out.split()[1]
    marker = remote / "runs" / run / "job" / "started"
    deadline = time.monotonic() + 120
    while not marker.exists() or not marker.read_text():
        if time.monotonic() > deadline:
            raise SystemExit(f"{run} did not start: {(remote / 'runs' / run / 'log').read_text()[-2000:]}")
        time.sleep(0.02)
    return float(marker.read_text()) - t


def main() -> int:
    if reason := containers.skip_reason():
        raise SystemExit(reason)
    with tempfile.TemporaryDirectory(prefix="bench-container-") as tmp:
        base = Path(tmp)
        dockerd = containers.Dockerd(base / "dockerd").start()
        registry = containers.Registry(base / "registry", "127.0.40.19", log_level="info").start()
        sshd = None
        try:
            dockerd.import_rootfs("bench/job:1")
            ref = f"{registry.host}/bench/job:1"
            registry.push(dockerd, "bench/job:1", "bench/job:1")
            path = f"{Path(containers.DOCKER).parent}:/usr/sbin:/usr/bin:/bin"
            sshd = Sshd(base / "sshd", "127.0.40.12", setenv=f"DOCKER_HOST={dockerd.host} PATH={path}").start()
            code, remote = base / "code", base / "remote"
            code.mkdir()
            (code / "job.py").write_text(JOB)
            sshd.stack_file(base / "stacks", "b", remote, sys.executable)
            env = {
                **os.environ,
                "GPU_TRAIN_STACKS_DIR": str(base / "stacks"),
                "GPU_TRAIN_HOME": str(base / "home"),
                "GPU_TRAIN_STACK": "b",
                "GPU_TRAIN_PROJECT": str(code),
            }
            secrets = base / "registry.env"
            secrets.write_text(f"GPU_TRAIN_REGISTRY_USER={registry.user}\nGPU_TRAIN_REGISTRY_TOKEN={registry.password}\n")

            def gt(*args: str) -> subprocess.CompletedProcess[str]:
                said = subprocess.run([GPU_TRAIN, *args], env=env, cwd=code, capture_output=True, text=True, timeout=180)
                if said.returncode != 0:
                    raise SystemExit(f"gpu-train {' '.join(args)}: {said.stderr[-2000:]}")
                return said

            start_time(gt, remote)  # warm: the agent installed, the shared connection up
            start_time(gt, remote, "--image", "bench/job:1")
            dockerd.docker("image", "rm", ref)  # (the push's tag) so that the first run pulls it
            start_time(gt, remote, "--image", ref, "--env-file", str(secrets))  # the one real pull
            log = registry.base / "registry.log"
            before = len(log.read_text().splitlines())
            plain, local, pulled = [], [], []
            cpu: dict[str, list[float]] = {"plainLaptop": [], "imageLaptop": [], "imageEngine": []}
            assert dockerd.proc is not None
            daemon = dockerd.proc.pid  # and containerd, its child
            engine_pids = [
                daemon,
                *(int(p) for p in subprocess.run(["pgrep", "-P", str(daemon)], capture_output=True, text=True).stdout.split()),
            ]
            for _ in range(RUNS):  # interleaved: the same host state for both
                c = laptop_cpu_s()
                plain.append(start_time(gt, remote))
                cpu["plainLaptop"].append(laptop_cpu_s() - c)
                c, e = laptop_cpu_s(), cpu_s(engine_pids)
                local.append(start_time(gt, remote, "--image", "bench/job:1"))  # imported here
                cpu["imageLaptop"].append(laptop_cpu_s() - c)
                cpu["imageEngine"].append(cpu_s(engine_pids) - e)  # dockerd and containerd (not the shims, which come and go)
                pulled.append(start_time(gt, remote, "--image", ref, "--env-file", str(secrets)))  # pulled from the registry, present
            engine_alone = []  # the floor: the engine's own start of a container with the same flags' kind, nothing of gpu-train's
            for _ in range(RUNS):
                t = time.time()
                dockerd.docker(
                    "run", "--rm", "--init", "--network", "host", "--ipc", "host", "--entrypoint", "python3", "bench/job:1", "-c", "pass"
                )
                engine_alone.append(time.time() - t)
            with tempfile.TemporaryDirectory() as conf:  # a re-pull of the unchanged image, as a boot's or a gone ID's would
                env_pull = {**dockerd.env, "DOCKER_CONFIG": conf}
                login = [containers.DOCKER, "login", "--username", registry.user, "--password-stdin", registry.host]
                subprocess.run(login, input=registry.password, text=True, env=env_pull, check=True, capture_output=True)
                before = len(log.read_text().splitlines())
                said = subprocess.run([containers.DOCKER, "pull", ref], env=env_pull, capture_output=True, text=True, check=True)
            again = log.read_text().splitlines()[before:]  # what the re-pull asked of the registry
            blobs = [line for line in again if re.search(r"/v2/\S+/blobs/sha256:", line) and "GET" in line]
            manifests = [line for line in again if "/manifests/" in line]
            result = {
                "runs": RUNS,
                "plainMedianS": round(statistics.median(plain), 3),
                "imageMedianS": round(statistics.median(local), 3),
                "pulledImageMedianS": round(statistics.median(pulled), 3),
                "overheadS": round(statistics.median(local) - statistics.median(plain), 3),
                "overheadPulledImageS": round(statistics.median(pulled) - statistics.median(plain), 3),
                "engineRunMedianS": round(statistics.median(engine_alone), 3),  # `docker run --rm IMAGE python3 -c pass`, whole
                "cpuMedianS": {k: round(statistics.median(v), 3) for k, v in cpu.items()},
                "loadAverage": os.getloadavg(),
                "repullManifestRequests": len(manifests),
                "repullBlobRequests": len(blobs),
                "repullSaid": said.stdout.strip().splitlines()[-2:],
            }
            print(json.dumps(result, indent=1))
            worst = max(statistics.median(local), statistics.median(pulled)) - statistics.median(plain)
            ok = worst <= 1.0 and not blobs and bool(manifests)
            print("PASS" if ok else "FAIL: over 1 s, or the re-pull fetched a layer")
            return 0 if ok else 1
        finally:
            if sshd:
                sshd.stop()
            registry.stop()
            dockerd.stop()


if __name__ == "__main__":
    sys.exit(main())
