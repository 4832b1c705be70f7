"""A run in a container: which engine, the GPUs' flags, `docker run`'s command line, stop by name.

Docker is the engine where this user may use its daemon; rootless Podman where Docker is not there
or refuses this user and Podman is; otherwise the launch is refused with the reason. Membership of
the `docker` group is root on the host (the daemon runs as root and mounts what it is told), so
gpu-train never asks for it: it says who can grant it, or to install Podman (rootless, no daemon).

The container is the job's process for everything else of the run: the `docker run` client is the
step the wrapper starts (its stdout is the run's log, its exit code the job's), and Docker passes the
client's signals to the container (``--sig-proxy``, on by default), where ``--init`` hands them to
the job. Killing the client leaves the container running with its GPUs busy, so every way a run ends
(`stop`, its unit's stop, a shutdown) also removes the container by name (``remove``); a client killed
between the container's create and its start leaves it created, which the wrapper removes as the run
ends (containerrun.wait).

Pure decisions first (tested by tables), the few effects after. Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zlib
from typing import Any

from gpu_train.containerspec import CONTAINER_PREFIX, IMAGE_REF_PATTERN, ContainerSpec

from .store import AgentError

DOCKER, PODMAN = "docker", "podman"
# What a probe of an engine found: usable, the daemon refused this user, no daemon answers, no CLI.
OK, DENIED, DOWN, ABSENT = "ok", "denied", "down", "absent"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
ENGINE_ENV = ("DOCKER_HOST", "DOCKER_CONFIG", "CONTAINER_HOST", "XDG_RUNTIME_DIR")  # where the engine is: a run's unit keeps them
PROBE_TIMEOUT_S = 20


def container_name(root: str, run_id: str) -> str:
    """The run's container: its id and a hash of REMOTE_ROOT (two users' runs of the same id on one
    daemon are two containers). Run ids are letters, digits and '_': a valid container name."""
    return f"{CONTAINER_PREFIX}{run_id}-{zlib.crc32(os.path.realpath(root).encode()):08x}"


def probe_said(returncode: int, stderr: str) -> str:
    """One engine probe (`ENGINE version`) in a word: OK, DENIED (the socket is not this user's) or DOWN."""
    if returncode == 0:
        return OK
    return DENIED if "permission denied" in stderr.lower() else DOWN


def choose_engine(docker: str, podman: str, user: str, uid: int) -> str:
    """DOCKER or PODMAN from what their probes said (OK, DENIED, DOWN, ABSENT), else AgentError with why
    and what to do. Docker first (what images, registries and the NVIDIA toolkit document), Podman as a
    rootless fallback: it needs no daemon and no group that is root on the host."""
    if docker == OK:
        return DOCKER
    if podman == OK:
        return PODMAN
    if docker == DENIED:
        raise AgentError(
            f"{user} may not use Docker on this host: its socket belongs to root and the docker group, and "
            "membership of that group is root on the host (gpu-train does not ask for it). Ask the host's "
            f"admin to add you (sudo usermod -aG docker {user}) if that is acceptable here, or to install "
            "Podman (rootless, no daemon: sudo apt-get install podman), which gpu-train uses then"
        )
    if docker == DOWN:
        start = "sudo systemctl start docker" if uid else "systemctl start docker"
        raise AgentError(f"Docker is installed but its daemon does not answer ({start}; or set DOCKER_HOST to its socket)")
    if podman == DOWN:
        raise AgentError("Podman is installed but does not run for this user (podman info says why; rootless needs subuid/subgid ranges)")
    raise AgentError(
        "a container run needs Docker or Podman on the host, and it has neither: sudo apt-get install docker.io "
        "(and the NVIDIA Container Toolkit for GPUs), or podman"
    )


def gpu_flags(engine: str, gpus: int, cdi: bool, nvidia_runtime: bool) -> list[str]:
    """How the container gets every GPU of the host: CDI (``--device nvidia.com/gpu=all``) where a CDI
    spec for NVIDIA is there (it survives `systemctl daemon-reload`, which the runtime hook's GPUs do not:
    NVIDIA/nvidia-container-toolkit#48), else Docker's ``--gpus all`` through the NVIDIA runtime. A host
    with GPUs and neither is refused: the job would run on the CPU without saying so."""
    if not gpus:
        return []
    if cdi:
        return ["--device", "nvidia.com/gpu=all"]
    if engine == DOCKER and nvidia_runtime:
        return ["--gpus", "all"]
    how = "sudo nvidia-ctk runtime configure --runtime=docker"
    if engine == PODMAN:
        how = "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
    raise AgentError(
        f"this host has {gpus} GPU(s), but {engine} cannot give them to a container: install the NVIDIA Container "
        f"Toolkit (nvidia-container-toolkit), then {how}"
    )


def run_argv(
    engine: str,
    name: str,
    image: str,
    container: ContainerSpec,
    job: list[str],
    *,
    mounts: list[str],
    workdir: str | None,
    env_names: list[str],
    uid: int,
    gid: int,
    grace_s: float,
    gpus: list[str],
    labels: dict[str, str],
    shm_bytes: int | None = None,
    runtime: str | None = None,
) -> list[str]:
    """The engine's `run` for a run's container. ``job`` is what runs inside: the project's command
    (python, torchrun or bash -c: it replaces the image's ENTRYPOINT and CMD) or, for the image's own
    program (``own_program``), its arguments after the entrypoint (Vertex's ``command`` then ``args``).

    --init: a PID 1 that passes SIGTERM on (a job as PID 1 without a handler ignores it); --stop-timeout:
    the run's shutdown grace when the daemon stops it (Docker's default kills after 10 s); ``env_names``:
    the job's variables by name (`--env NAME`, the value from the client's environment: no value of them
    is on a command line, which every user reads in /proc); host network
    (NCCL across nodes); host IPC (DataLoader workers' shared memory: a container's /dev/shm is 64 MB);
    --user: files written to the mounted folders are the user's, not root's. ``shm_bytes``: where the host's
    IPC cannot be shared (see ``host_ipc``), a /dev/shm of the container's own of that size instead;
    ``runtime``: the OCI runtime where the engine's own cannot run here (``oci_runtime``)."""
    argv = [engine, "run", "--rm", "--name", name, "--init", "--stop-timeout", str(max(1, round(grace_s)))]
    argv += ["--runtime", runtime] if runtime else []
    ipc = ["--shm-size", f"{shm_bytes}b"] if shm_bytes else ["--ipc", "host"]
    argv += ["--network", "host", *ipc, "--user", f"{uid}:{gid}", *gpus]
    if engine == PODMAN:
        argv += ["--userns", "keep-id"]  # rootless: the user's own uid inside maps to theirs outside
    for key, value in sorted(labels.items()):
        argv += ["--label", f"{key}={value}"]
    for path in mounts:
        argv += ["--volume", f"{path}:{path}"]
    if workdir:
        argv += ["--workdir", workdir]
    for env in env_names:
        argv += ["--env", env]
    if container.own_program:
        if container.entrypoint:
            argv += ["--entrypoint", container.entrypoint[0], image, *container.entrypoint[1:], *job]
        else:
            argv += [image, *job]
        return argv
    return [*argv, "--entrypoint", job[0], image, *job[1:]]


def host_ipc(engine: str, mqueue_mounted: bool) -> bool:
    """Whether the container can share the host's IPC (its /dev/shm, as big as the host's): Podman then
    mounts the host's /dev/mqueue too, and refuses where there is none ("statfs /dev/mqueue: no such file
    or directory": a host that is itself a container, which systemd did not set up); Docker does not."""
    return engine == DOCKER or mqueue_mounted


def oci_runtime(engine: str, configured: str, hybrid: bool, runc: bool) -> str | None:
    """The OCI runtime to ask for instead of the engine's ``configured`` one, or None to keep it: Podman's
    crun refuses a host whose cgroups are v1 with a v2 hierarchy beside them ("crun: cgroups in hybrid mode
    not supported, drop all controllers from cgroupv2"), where runc runs; without runc that is refused."""
    if engine != PODMAN or not hybrid or configured != "crun":
        return None
    if runc:
        return "runc"
    raise AgentError(
        "Podman's runtime here is crun, which refuses this host's cgroups (v1, with a v2 hierarchy beside them: "
        "'cgroups in hybrid mode not supported'): install runc (sudo apt-get install runc), which gpu-train uses then"
    )


def own_program_args(container: ContainerSpec, image_cmd: list[str] | None, extra: list[str]) -> list[str]:
    """The arguments after the image (its own program): ``args`` as given, else the image's CMD where the
    entrypoint is kept (a relaunch's resume arguments go after them, so they never replace the CMD)."""
    given = list(container.args)
    if not given and not container.entrypoint and extra:
        given = list(image_cmd or [])
    return given + list(extra)


def pinned(inspect: dict[str, Any], named: str) -> tuple[str, str | None]:
    """(the image's ID, its registry digest REPO@sha256:... or None) from `image inspect`: the ID is the
    content every start of the run runs; the digest pulls that very content where the ID is gone."""
    image_id = str(inspect.get("Id") or "")
    if not image_id:
        raise AgentError(f"the engine describes {named} without an ID")
    digests = [str(d) for d in inspect.get("RepoDigests") or []]
    repo = repository(named)
    same = [d for d in digests if d.split("@", 1)[0] in (repo, f"docker.io/{repo}", f"docker.io/library/{repo}")]
    chosen = same or digests
    return image_id, chosen[0] if chosen else None


def repository(ref: str) -> str:
    """An image reference less its tag and digest: ``host:5000/a/b:tag`` -> ``host:5000/a/b``."""
    ref = ref.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return ref[: len(ref) - len(last)] + last.split(":", 1)[0]


REF_RE = re.compile(IMAGE_REF_PATTERN)


def check_ref(ref: str, where: str = "--image") -> str:
    """An image reference a user gave (never an option of the engine's, never a path)."""
    if not REF_RE.fullmatch(ref):
        raise AgentError(f"{where} {ref!r} is not an image reference (e.g. nvcr.io/nvidia/pytorch:24.05-py3, REPO@sha256:...)")
    return ref


def space_problem(free: int, layers: int | None, floor: int) -> str | None:
    """Why a pull would fill the disk, or None: the compressed layers are downloaded and then unpacked
    beside them, so a pull needs about three times their size (``floor`` when the size is unknown)."""
    need = 3 * layers if layers else floor
    if free >= need:
        return None
    size = f"its layers are {layers / 2**30:.1f} GiB compressed" if layers else "its size is unknown"
    return f"{free / 2**30:.1f} GiB free, and {size}: the pull needs about {need / 2**30:.1f} GiB"


def pull_progress(line: str, done: set[str], layers: set[str]) -> str | None:
    """A pull's output line as a count of layers done ("3/7 layers"), for the log and `status`. Docker
    says each layer's state ("ID: Pull complete"); Podman, without a terminal, says each blob as its copy
    starts ("Copying blob sha256:ID") and the config once every blob is in ("Copying config")."""
    text = line.strip()
    if m := re.match(r"Copying blob (?:sha256:)?([0-9a-f]{12})[0-9a-f]*(.*)", text):
        layers.add(m.group(1))
        if "skipped" in m.group(2) or "done" in m.group(2):
            done.add(m.group(1))
        return f"{len(done)}/{len(layers)} layers"
    if text.startswith("Copying config"):
        done.update(layers)
        return f"{len(done)}/{len(layers)} layers"
    m = re.match(r"([0-9a-f]{12}): (.*)", text)
    if not m:
        return None
    layer, what = m.groups()
    layers.add(layer)
    if what in ("Pull complete", "Already exists"):
        done.add(layer)
    return f"{len(done)}/{len(layers)} layers"


# -- effects -------------------------------------------------------------------------------------
def run_quiet(argv: list[str], timeout: float = PROBE_TIMEOUT_S, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return subprocess.CompletedProcess(argv, 127, "", str(e))


def probe(engine: str) -> str:
    if not shutil.which(engine):
        return ABSENT
    said = run_quiet([engine, "version", "--format", "{{.Server.Version}}" if engine == DOCKER else "{{.Version}}"])
    return probe_said(said.returncode, said.stderr)


def engine() -> str:
    """The engine this user runs containers with here (see choose_engine)."""
    import pwd

    docker = probe(DOCKER)
    podman = probe(PODMAN) if docker != OK else ABSENT
    return choose_engine(docker, podman, pwd.getpwuid(os.getuid()).pw_name, os.getuid())


def host_runtime(engine_name: str) -> str | None:
    """oci_runtime for this host: its cgroup layout (hybrid: /sys/fs/cgroup/unified mounted beside v1),
    Podman's configured runtime (asked only then) and whether runc is there."""
    if engine_name != PODMAN or not os.path.ismount("/sys/fs/cgroup/unified"):
        return None
    configured = run_quiet([PODMAN, "info", "--format", "{{.Host.OCIRuntime.Name}}"]).stdout.strip()
    return oci_runtime(engine_name, configured, True, bool(shutil.which("runc")))


def host_gpu_flags(engine_name: str, gpus: int) -> list[str]:
    """gpu_flags for this host: is there an NVIDIA CDI spec, does Docker know the nvidia runtime."""
    if not gpus:
        return []
    cdi = any(os.path.isfile(os.path.join(d, f)) for d in CDI_DIRS for f in ("nvidia.yaml", "nvidia.json"))
    if engine_name == DOCKER and cdi:  # Docker takes CDI devices only where its daemon has CDI on
        info = run_quiet([DOCKER, "info", "--format", "{{json .CDISpecDirs}}"]).stdout.strip()
        cdi = info not in ("", "null", "[]")
    runtime = False
    if engine_name == DOCKER:
        runtimes = run_quiet([DOCKER, "info", "--format", "{{json .Runtimes}}"]).stdout
        runtime = "nvidia" in runtimes or bool(shutil.which("nvidia-container-runtime-hook"))
    return gpu_flags(engine_name, gpus, cdi, runtime)


def inspect(engine_name: str, ref: str) -> dict[str, Any] | None:
    """`image inspect REF`, or None where the image is not on this host."""
    said = run_quiet([engine_name, "image", "inspect", ref])
    if said.returncode != 0:
        return None
    try:
        docs = json.loads(said.stdout)
    except ValueError:
        return None
    return docs[0] if isinstance(docs, list) and docs and isinstance(docs[0], dict) else None


def data_root(engine_name: str) -> str:
    """Where the engine keeps its layers (the file system a pull fills)."""
    fmt = "{{.DockerRootDir}}" if engine_name == DOCKER else "{{.Store.GraphRoot}}"
    return run_quiet([engine_name, "info", "--format", fmt]).stdout.strip() or "/"


def layers_size(engine_name: str, ref: str, env: dict[str, str] | None = None) -> int | None:
    """The compressed size of the image's layers, from its registry's manifest (None when it does not say);
    ``env``: the pull's (its credentials). A registry on loopback is asked over plain HTTP, as Docker pulls from it."""
    if engine_name != DOCKER:
        return None
    host = ref.split("/", 1)[0]
    loopback = "/" in ref and (host.split(":")[0] == "localhost" or host.startswith("127."))
    said = run_quiet([DOCKER, "manifest", "inspect", *(["--insecure"] if loopback else []), "-v", ref], timeout=60, env=env)
    try:
        docs = json.loads(said.stdout) if said.returncode == 0 else None
    except ValueError:
        return None
    docs = docs if isinstance(docs, list) else [docs] if docs else []
    sizes = []
    for doc in docs:
        if (doc.get("Descriptor") or {}).get("platform", {}).get("architecture", "amd64") not in ("amd64", None):
            continue
        sizes.append(sum(int(layer.get("size") or 0) for layer in (doc.get("SchemaV2Manifest") or {}).get("layers") or []))
    return max(sizes) if sizes else None


def remove(engine_name: str, name: str, grace_s: float) -> bool:
    """Stop the container by name (SIGTERM, SIGKILL after ``grace_s``) and remove it; whether it was there."""
    said = run_quiet([engine_name, "stop", "--time", str(max(0, round(grace_s))), name], timeout=grace_s + 60)
    run_quiet([engine_name, "rm", "--force", name], timeout=60)
    return said.returncode == 0


def removal(root: str, run_id: str, grace_s: float) -> list[list[str]] | None:
    """The commands that stop a run's container by name (SIGTERM, ``grace_s`` for the job, SIGKILL) and
    remove it: its unit's ExecStopPost. None without an engine."""
    try:
        name = engine()
    except AgentError:
        return None
    path, container = shutil.which(name) or name, container_name(root, run_id)
    return [[path, "stop", "--time", str(max(1, round(grace_s))), container], [path, "rm", "--force", container]]
