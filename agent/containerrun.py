"""The wrapper's side of a container run: the image pulled and pinned, then the job started in it.

An image is pulled when it is not on the host (Docker's own rule: an image here starts at once, and
offline). The first start resolves the image to its ID (and registry digest) and records both in the run's
state.json (`status` shows them); every later start (a relaunch at boot, after a preemption, `resume`) runs that ID, and
pulls it by digest where it is gone, so a tag moved meanwhile never changes a run's environment. A
pull is a step of the run like `pip install` (its pid recorded, `stop` ends it), its lines in the log
with a count of layers done, after a check that the engine's disk has room for it. Registry
credentials (`registry.py`) are kept outside the run's folder (REMOTE_ROOT/secrets/RUN.json, which no
container mounts) and logged in with into a folder of the pull's own, removed after it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from typing import TYPE_CHECKING

from gpu_train.contract import JobSpec

from . import container, registry
from .procs import gpu_count
from .status import machine_settings
from .store import AgentError, read_state, settings, spec_or_none, update_state

if TYPE_CHECKING:
    from .wrap import Wrapper

PULL_FLOOR = 4 << 30  # free bytes a pull needs where the registry does not say the image's size
IMAGE_HOME = "/tmp"  # HOME inside: the user's uid may have no home in the image


def ensure_image(w: Wrapper, engine: str, spec: JobSpec, run_dir: str) -> str:
    """The image ID this start runs: the run's pinned one, else the named image's (pulled when it is not
    here, or refreshed from its registry when it came from one and is named by tag), now pinned."""
    named = spec.container.image if spec.container else ""
    state = read_state(run_dir)
    if state.image_id:
        if container.inspect(engine, state.image_id) is not None:
            return state.image_id
        if not state.image_digest:
            raise AgentError(
                f"the run's image {state.image_id} ({named}) is gone from this host and came from no registry, "
                "so this very image cannot be had again: load it again, or start a new run"
            )
        w.say(f"the run's image {state.image_id} is gone from this host: pulling it by its digest {state.image_digest}")
        pull(w, engine, state.image_digest, spec, run_dir)
        doc = container.inspect(engine, state.image_digest)
        if doc is None or doc.get("Id") != state.image_id:
            raise AgentError(f"{state.image_digest} pulled, but it is not the run's image {state.image_id}")
        return state.image_id
    doc = container.inspect(engine, named)
    if doc is None:  # pulled when missing (Docker's own rule): an image here starts at once, offline too
        pull(w, engine, named, spec, run_dir)
        doc = container.inspect(engine, named)
    if doc is None:
        raise AgentError(f"{named} is not on this host after the pull")
    image_id, digest = container.pinned(doc, named)
    update_state(run_dir, image_id=image_id, image_digest=digest)
    w.say(f"image {named}: {image_id}" + (f" ({digest})" if digest else " (built or loaded here: no registry digest)"))
    return image_id


def pull(w: Wrapper, engine: str, ref: str, spec: JobSpec, run_dir: str) -> None:
    """`ENGINE pull REF` as a step of the run, its lines in the log with the layers done so far, after a
    look at the registry's manifest (with the pull's credentials) for whether the disk has room."""
    root = os.path.dirname(os.path.dirname(run_dir))
    conf = machine_settings(root) or settings(root)
    secrets = {**spec.env, **registry.kept(root, spec.run_id)}  # (a run launched by an older agent: in its spec)
    with registry.credentials(engine, ref, secrets, w.say, conf.gcp, conf.metadata_url) as env:
        check_space(engine, ref, env)
        w.say(f"pulling {ref} with {engine}")
        proc = w.start([engine, "pull", ref], "step_pid", stdout=subprocess.PIPE, env=env, cwd=run_dir)
        done: set[str] = set()
        layers: set[str] = set()
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            count = container.pull_progress(line, done, layers)
            shown = count and (line.endswith(("complete", "exists")) or line.startswith("Copying"))
            w.say(f"pull: {line}" + (f" ({count})" if shown else ""))
        code = proc.wait()
        w.child = None
    if code != 0:
        raise AgentError(f"{engine} pull {ref} failed (exit {code}): the log says why")


def check_space(engine: str, ref: str, env: dict[str, str]) -> None:
    """Refuse a pull the engine's disk has no room for (a full disk mid-pull fails every run on it)."""
    where = container.data_root(engine)
    try:
        st = os.statvfs(where if os.path.isdir(where) else "/")
    except OSError:
        return
    problem = container.space_problem(st.f_bavail * st.f_frsize, container.layers_size(engine, ref, env), PULL_FLOOR)
    if problem:
        raise AgentError(f"not pulling {ref} into {where}: {problem} (free some space: {engine} image prune)")


def start(
    w: Wrapper, root: str, run_dir: str, spec: JobSpec, env: dict[str, str], job: list[str], extra: list[str]
) -> subprocess.Popen[bytes]:
    """Start the run's container (the engine's client is the job's process): ``env`` is the job's
    environment (its values reach the container by name only), ``job`` the project's command, or with
    the image's own program the arguments after its entrypoint (``extra``: the resume arguments)."""
    c = spec.container
    assert c is not None
    state = read_state(run_dir)
    engine = state.engine or container.engine()  # (launch chose it)
    image_id = ensure_image(w, engine, spec, run_dir)
    name = container.container_name(root, spec.run_id)
    if state.resumes:  # a relaunch: one left by a crash of the machine goes first
        container.run_quiet([engine, "rm", "--force", name], timeout=60)
    data_dir = env["DATA_DIR"]
    os.makedirs(data_dir, exist_ok=True)  # (a folder the engine would make is root's)
    mounts = [run_dir, data_dir]  # the code, JOB_DIR, the notice file and the log, at the same paths
    if c.own_program:  # Vertex's output folders, under JOB_DIR (unless the job's env names its own)
        for key, sub in (("AIP_MODEL_DIR", "model/"), ("AIP_CHECKPOINT_DIR", "checkpoints/"), ("AIP_TENSORBOARD_LOG_DIR", "logs/")):
            env.setdefault(key, os.path.join(env["JOB_DIR"], sub))
        doc = container.inspect(engine, image_id) or {}
        job = container.own_program_args(c, (doc.get("Config") or {}).get("Cmd"), extra)
    names = sorted(set(spec.env) | {k for k in env if k not in os.environ or os.environ[k] != env[k]})
    names = [n for n in names if not n.startswith(registry.PREFIX) and n not in ("PATH", "VIRTUAL_ENV", "HOME")]
    names.append(f"HOME={IMAGE_HOME}")  # (no secret: the one value on the command line)
    argv = container.run_argv(
        engine,
        name,
        image_id,
        c,
        job,
        mounts=mounts,
        workdir=None if c.own_program else os.path.join(run_dir, "code"),
        env_names=names,
        uid=os.getuid(),
        gid=os.getgid(),
        grace_s=(machine_settings(root) or settings(root)).shutdown_grace_s,  # its unit's: on a VM, the stack's
        gpus=container.host_gpu_flags(engine, gpu_count()),
        labels={"gpu-train.run": spec.run_id, "gpu-train.root": root},
        shm_bytes=None if container.host_ipc(engine, os.path.ismount("/dev/mqueue")) else host_shm_bytes(),
        runtime=container.host_runtime(engine),
    )
    w.say(f"{spec.run_id}: in {c.image} ({image_id[:19]}): {shlex.join(argv)}")
    try:
        return w.start(argv, "pid", cwd=run_dir, env=env)
    except OSError as e:
        raise AgentError(f"cannot start {engine}: {e.strerror or e}") from None


def host_shm_bytes() -> int:
    """The size of the host's /dev/shm (what --ipc host would have given), at least Docker's 64 MB."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return 64 << 20
    return max(64 << 20, st.f_blocks * st.f_frsize)


def wait(w: Wrapper, root: str, run_dir: str, proc: subprocess.Popen[bytes]) -> int:
    """The job's exit code: its container's. A container run's client may end while its container goes on
    (the client killed, say by an OOM killer or by hand; rootless Podman's client on any SIGINT or SIGTERM):
    the wrapper attaches to it again as long as no stop or shutdown came, so the log, the signals and the
    end are the container's; after a stop or shutdown it waits for the container, whose job has its grace.
    A client that ended between the container's create and its start leaves it created, never started,
    which --rm never removes (it removes a container that ran): the wrapper removes it at the run's end."""
    code = proc.wait()
    found = of_run(root, run_dir)
    if found is None:
        return code
    engine, name = found
    while not w.halted() and running(found):
        w.say(f"the {engine} client ended ({how(code)}) but the container {name} runs on: attached to it again")
        try:
            again = w.start([engine, "attach", name], "pid", cwd=run_dir)
        except Exception:  # a stop or shutdown came first (wrap.Halted): the end is recorded as that
            break
        code = again.wait()
    if running(found):  # a stop or shutdown: the job is in its handler, and `stop` ends it after the grace
        said = container.run_quiet([engine, "wait", name], timeout=7 * 24 * 3600)
        if said.returncode == 0 and said.stdout.strip().lstrip("-").isdigit():
            code = int(said.stdout.strip())
    left = status(found)
    if left in NEVER_STARTED:
        w.say(f"the {engine} client ended ({how(code)}) before the container {name} started: removed it ({left})")
        container.run_quiet([engine, "rm", "--force", name], timeout=60)
    return code


def how(code: int) -> str:
    """How a process ended, from its exit code as Popen gives it (a signal negative)."""
    return signal_name(-code) if code < 0 else f"exit {code}"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def stop(root: str, run_id: str, grace_s: float) -> bool:
    """Remove a run's container by name (after `stop` signalled its client, or the client was gone)."""
    found = of_run(root, os.path.join(root, "runs", run_id))
    return container.remove(found[0], found[1], grace_s) if found else False


def of_run(root: str, run_dir: str) -> tuple[str, str] | None:
    """(engine, container name) of a container run (its engine as launch chose it), else None."""
    spec = spec_or_none(run_dir)
    if not (spec and spec.container):
        return None
    engine = read_state(run_dir).engine
    if not engine:
        try:
            engine = container.engine()
        except AgentError:
            return None
    return engine, container.container_name(root, spec.run_id)


def running(found: tuple[str, str] | None) -> bool:
    """Whether the run's container runs. Its client may have ended while it runs on: rootless Podman's
    client exits (1) at once on SIGINT or SIGTERM, having passed the signal on, and the job goes on in its
    handler, so a run's end is its container's, not its client's."""
    return status(found) == "running"


# A container's states before its first start (Docker's and Podman's `created`; Podman's `configured`, before
# its runtime made it).
NEVER_STARTED = ("created", "configured")


def status(found: tuple[str, str] | None) -> str | None:
    """The run's container's state as its engine says it (created, running, exited, ...), None where there
    is none."""
    if found is None:
        return None
    engine, name = found
    said = container.run_quiet([engine, "inspect", "--format", "{{.State.Status}}", name])
    return (said.stdout.strip() or None) if said.returncode == 0 else None


def kill(found: tuple[str, str] | None, sig: int) -> bool:
    """``sig`` to the run's container (its init passes it to the job), where its client is gone."""
    if found is None:
        return False
    engine, name = found
    return container.run_quiet([engine, "kill", "--signal", signal_name(sig), name]).returncode == 0


def ended(pid: int | None, started: str | None, found: tuple[str, str] | None, timeout: float) -> bool:
    """Wait up to ``timeout`` for the job to end: its process (a container run's client) and its container."""
    from .procs import alive

    deadline = time.time() + timeout
    while True:
        client = alive(pid, started)
        if not client and not running(found):
            return True
        if time.time() >= deadline:
            return False
        time.sleep(0.1 if client else 0.5)  # (the engine's CLI costs CPU: asked twice a second)
