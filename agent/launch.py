"""`launch`: move the synced code into place and start the job's wrapper under screen."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from gpu_train.answers import Launched, Ready, Waiting
from gpu_train.bucketdoc import GOOGLE_ENV
from gpu_train.codec import answer
from gpu_train.contract import FAILED, GO_WHEN, STARTING, JobSpec, cli_name, go_marker, node_roles

from . import container, notify, outputs, registry, source, units
from .outcome import given_up, hold, host_notes, launched
from .procs import detect_python, gpu_count
from .pyenv import fingerprint, interpreter
from .status import busy_runs, machine_settings
from .store import (
    AgentError,
    agent_log,
    locked,
    now,
    read_json,
    settings,
    spec_or_none,
    update_state,
    write_json,
    write_settings,
)

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# A launch the laptop was told did not start (outcome.given_up) must never start later, however long it
# waits for its "go" (a fan-out's relay has no deadline): its mark, an empty file, is kept a week.
GIVEN_UP_KEEP_S = 7 * 86400


def clean_staging(root: str, older_than_s: float = 3600) -> None:
    """Code synced for launches that never happened (refused, or the laptop went away), and their markers."""
    staging = os.path.join(root, "staging")
    for name in os.listdir(staging) if os.path.isdir(staging) else []:
        path = os.path.join(staging, name)
        keep = GIVEN_UP_KEEP_S if name.endswith(".given-up") else older_than_s
        with contextlib.suppress(OSError):
            # ctime, not mtime: rsync -a gives the folder its source's (old) mtime while it syncs.
            if time.time() - os.lstat(path).st_ctime > keep:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:  # a fan-out's go marker (RUN.arrived, RUN.relayed)
                    os.remove(path)


def reuse_code(root: str, base: str, manifest: str | None, staging: str) -> bool:
    """Stage the last run's code again (hard links) when the laptop's manifest says nothing changed: what
    was sent to it, not what its job wrote beside it (outputs.stage_sent); a run from before that record,
    as its folder is."""
    last = os.path.join(root, "code", f"{base}.last")
    recorded = read_json(os.path.join(root, "code", f"{base}.manifest")) or {}
    if not manifest or recorded.get("manifest") != manifest or not os.path.isdir(last):
        return False
    shutil.rmtree(staging, ignore_errors=True)
    run_dir = os.path.dirname(os.path.realpath(last))
    if os.path.isfile(os.path.join(run_dir, outputs.SENT)):
        if outputs.stage_sent(run_dir, staging):
            return True
        shutil.rmtree(staging, ignore_errors=True)
        return False
    shutil.copytree(os.path.realpath(last), staging, symlinks=True, copy_function=os.link)
    return True


def await_word(marker: str | None, poll_s: float = 0.01) -> str:
    """Wait for the laptop's word on stdin, or for ``marker`` to appear, whichever comes first: "go"
    (the laptop's), "marker", or what else the laptop said ("abort"; "" when it went away). The
    laptop says "go" to a node of a fan-out only after node 0 reported the code there, which is after
    the marker was left: a "go" found beside the marker counts as the marker's. stdin is read by a
    thread of its own, buffered as the spec before it was (a "go" sent after the marker was taken is
    never read)."""
    said: list[str] = []
    heard = threading.Event()

    def listen() -> None:
        said.append(sys.stdin.readline().strip())
        heard.set()

    threading.Thread(target=listen, daemon=True).start()
    while not heard.wait(poll_s if marker is not None else None):
        if marker is not None and os.path.exists(marker):
            return "marker"
    return "marker" if said[0] == "go" and marker is not None and os.path.exists(marker) else said[0]


def refuse_if_busy(root: str, base: str, project: str | None) -> None:
    busy = busy_runs(root, base, project)
    if busy:
        raise AgentError(
            f"a run named {base!r} is already running ({', '.join(busy)}): "
            f"stop it ({cli_name()} stop --run {busy[0]}) or pick another --name"
        )


def check_pool(spec: JobSpec) -> None:
    """A pool's own job (`train --pools`) only on a node of that pool: its place in the cluster says which."""
    if spec.pool is None:
        return
    node = spec.node or {}
    place = {k: node.get(k, d) for k, d in (("rank", 0), ("nnodes", 1), ("ps", 0))}
    rank, nnodes, ps = (v if isinstance(v, int) else -1 for v in place.values())
    roles = node_roles(nnodes, ps) if nnodes > 0 and ps >= 0 else []
    where = roles[rank] if 0 <= rank < len(roles) else "unknown"
    if where != spec.pool or not spec.container:
        raise AgentError(
            f"this node's spec is the {spec.pool} pool's job, but the node is the cluster's {where} (node {rank}): not started"
        )


def driver_missing(want: int) -> str | None:
    """What a job that expects ``want`` GPUs still waits for (the NVIDIA driver, installed on a GCP VM's
    first boot), None once nvidia-smi lists them all: a launch and a sweep's start both answer it, and the
    laptop asks again (remote/tasks/launching.py until_ready)."""
    have = gpu_count() if want else 0
    return f"NVIDIA driver: {have}/{want} GPUs visible to nvidia-smi" if have < want else None


def cmd_launch(root: str, doc: dict[str, Any], await_go: bool) -> Launched | Waiting:
    """Move the synced code into place and start the job under screen.

    With ``await_go`` the checks run while the laptop is still syncing: the agent prints
    {"ready": true} and waits for "go" on stdin, so the launch costs one round trip after the sync;
    when it reused the last run's code (the spec's ``reuse_code``), there is no sync and it goes on at once.
    """
    try:  # the spec as the contract reads it: a field of the wrong type or a newer contract, said here
        spec = JobSpec.from_json(doc)
    except ValueError as e:
        raise AgentError(str(e)) from None
    run_id, base = spec.run_id, spec.base
    check_pool(spec)
    if spec.agent_settings:  # the stack's settings (maxResumes, idle stop, ...) for boot and tick
        write_settings(root, spec.agent_settings)
    clean_staging(root)
    if not shutil.which("screen"):
        raise AgentError("screen is not installed on this host: sudo apt-get install screen")
    waiting = driver_missing(spec.expect_gpus)
    if waiting:
        return answer(Waiting, waiting=waiting)
    python = detect_python(spec.python, imports=functools.partial(imports_torch_probed, root))
    engine = None
    if spec.container:  # the job's Python is the image's; the engine and the GPUs' way in are checked now
        container.check_ref(spec.container.image)
        engine = container.engine()
        container.host_gpu_flags(engine, gpu_count())
        container.host_runtime(engine)  # (crun on a hybrid cgroup host without runc: refused now, with the reason)
        managed = False
    else:
        managed = check_python(root, python, bool(spec.python), spec.needs_torch)
    notes = host_notes(root)  # (while the laptop still syncs)
    staging = os.path.join(root, "staging", run_id)
    if await_go:
        refuse_if_busy(root, base, spec.project)
        reused = spec.reuse_code and reuse_code(root, base, spec.code_manifest, staging)
        print(json.dumps(answer(Ready, ready=True, reused=reused)), flush=True)
        # The code reused: nothing is left for the laptop to send, so no "go" is awaited (one round trip less).
        when = spec.go_when if spec.go_when in GO_WHEN else None
        word = "go" if reused else await_word(go_marker(root, run_id, when) if when else None)
        if word == "marker":
            agent_log(root, f"{run_id}: launched on the fan-out's own word ({when}), not the laptop's")
        elif word != "go":
            raise AgentError("launch aborted by the laptop (the code sync failed)")
    for when in GO_WHEN:
        with contextlib.suppress(OSError):
            os.remove(go_marker(root, run_id, when))
    with locked(root):
        if os.path.exists(given_up(root, run_id)):  # the laptop lost the word of this launch and was told it ends here
            shutil.rmtree(staging, ignore_errors=True)
            raise AgentError(f"{run_id} was not started: the laptop lost its connection during the launch and gave it up")
        if busy_runs(root, base, spec.project):
            shutil.rmtree(staging, ignore_errors=True)
            refuse_if_busy(root, base, spec.project)
        run_dir = os.path.join(root, "runs", run_id)
        if os.path.exists(run_dir):
            raise AgentError(f"run {run_id} already exists on this host: pick another --name")
        try:
            os.makedirs(os.path.dirname(run_dir), exist_ok=True)
            os.mkdir(run_dir)
        except FileExistsError:
            raise AgentError(f"run {run_id} already exists on this host: pick another --name") from None
        held = hold(run_dir)  # until the wrapper started or failed: what `launch-outcome` waits for (outcome.py)
        if spec.container and spec.container.own_program:
            os.makedirs(staging, exist_ok=True)  # the image's own program: no code is sent
        if not os.path.isdir(staging):
            os.rmdir(run_dir)
            raise AgentError(f"the code for {run_id} did not arrive (no {staging}): run {cli_name()} train again")
        outputs.unshare(staging)  # no inode shared with an earlier run's working directory
        os.replace(staging, os.path.join(run_dir, "code"))
        outputs.record_sent(run_dir)  # what was sent, so that what the job writes beside it is its output
        os.makedirs(os.path.join(run_dir, "job"), exist_ok=True)
        last = os.path.join(root, "code", f"{base}.last")
        os.makedirs(os.path.dirname(last), exist_ok=True)
        tmp_link = f"{last}.tmp.{os.getpid()}"
        os.symlink(os.path.join("..", "runs", run_id, "code"), tmp_link)
        os.replace(tmp_link, last)
        if spec.code_manifest:
            write_json(f"{last[: -len('.last')]}.manifest", {"manifest": spec.code_manifest})
        notify.keep(root, run_id, spec.notify)  # the run's own webhook: 0600, never in spec.json
        env, secrets = registry.split(spec.env)  # the run's folder is its container's: no token in it
        spec = replace(spec, python=python, externally_managed=managed, path=os.environ.get("PATH"), notify=None, env=env)
        write_json(os.path.join(run_dir, "spec.json"), spec.to_json())
        registry.keep(root, run_id, secrets)
        update_state(run_dir, id=run_id, base=base, project=spec.project, state=STARTING, created=now(), resumes=0, engine=engine)
    try:
        start_wrapper(root, run_id)
    except AgentError as e:
        update_state(run_dir, state=FAILED, ended=now(), reason=str(e))
        raise
    finally:
        os.close(held)
    return launched(root, spec, notes)


# What only the SSH session that ran `launch` has. A run outlives that session, and `boot` relaunches it
# with none; with SSH_CLIENT set, a job's `bash -c` reads the login user's ~/.bashrc (bash's rule for
# commands from sshd), so its first start would see what no restart after a reboot sees.
SESSION_ONLY = ("SSH_CLIENT", "SSH2_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_ORIGINAL_COMMAND")


def start_wrapper(root: str, run_id: str) -> str:
    """Start the run's wrapper: in a systemd unit of its own where the host allows (see units.py),
    else in a detached screen session. Either way `screen -r NAME` shows it; returns NAME."""
    run_dir = os.path.join(root, "runs", run_id)
    wrapper = [sys.executable, "-I", "-S", source.for_wrapper(root), "--root", root, "wrap", run_id]
    name = units.screen_name(run_id)
    if units.available():
        spec = spec_or_none(run_dir)
        env = {"PATH": (spec and spec.path) or os.environ.get("PATH") or DEFAULT_PATH}
        for key in ("LANG", *GOOGLE_ENV, *container.ENGINE_ENV):  # the login's credentials (or emulator), its engine's socket
            if os.environ.get(key):
                env[key] = os.environ[key]
        update_state(run_dir, unit=units.unit_name(run_id))
        try:
            conf = machine_settings(root) or settings(root)  # on a VM, the grace its stack gives
            post = container.removal(root, run_id, conf.shutdown_grace_s) if spec and spec.container else None
            units.start_unit(run_id, conf.shutdown_grace_s, wrapper, env, post)
        except OSError as e:
            raise AgentError(str(e)) from None
        return name
    update_state(run_dir, unit=None)
    try:
        env = {k: v for k, v in os.environ.items() if k not in SESSION_ONLY}  # the agent call's, less its session's
        subprocess.run(["screen", "-dmS", name, *wrapper], check=True, capture_output=True, env=env)
    except (OSError, subprocess.CalledProcessError) as e:
        raise AgentError(f"screen could not start the run's wrapper: {e}") from None
    return name


# Prints whether the Python refuses installs of its own (PEP 668's marker, outside a venv).
MANAGED_PROBE = (
    "import os,sys,sysconfig;print(sys.prefix==sys.base_prefix and "
    "os.path.isfile(os.path.join(sysconfig.get_path('stdlib'),'EXTERNALLY-MANAGED')))"
)
# The Pythons that passed check_python, each with the files it was then: REMOTE_ROOT/python/probed.json.
PROBED = os.path.join("python", "probed.json")


def imports_torch_probed(root: str, python: str) -> bool:
    """Whether ``python`` imports torch, by check_python (so a Python found once is not asked again)."""
    try:
        check_python(root, python, True, True)
    except AgentError:
        return False
    return True


def still_probed(known: dict[str, Any], executable: list[int], torch: bool) -> bool:
    """Whether a Python's record in PROBED holds for it now: the same executable, and torch's package
    the same file when the job needs torch."""
    if known.get("python") != executable:
        return False
    return not torch or (known.get("torch") is not None and fingerprint(known.get("torchFile")) == known.get("torch"))


def check_python(root: str, python: str, configured: bool, torch: bool) -> bool:
    """Before "started": the job's Python runs, and imports torch when the job needs it. Whether it
    is externally managed (PEP 668), so that requirements go into a venv of it instead.

    A Python that passed before is not asked again while it is the same: its interpreter and, for a job
    that needs torch, torch's package the same files (inode, size, mtime). Importing torch takes
    seconds, and every train of a torch script waited for it before "started", unchanged code too.
    A script in its place (a pyenv or asdf shim, a wrapper) is asked every time: it picks its
    interpreter as it runs."""
    where = f"gpu-train:python = {python}" if configured else f"the host's Python {python} (detected; set gpu-train:python)"
    seen = read_json(os.path.join(root, PROBED)) or {}
    key = f"{python} {'torch' if torch else 'python'}"
    executable = interpreter(python)
    known = seen.get(key)
    if isinstance(known, dict) and executable and still_probed(known, executable, torch):
        return bool(known.get("managed"))
    probe = ("import torch;print(torch.__file__);" if torch else "") + MANAGED_PROBE
    try:
        result = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise AgentError(
            f"{where}: cannot run it ({getattr(e, 'strerror', None) or e}); set gpu-train:python to a Python on the host"
        ) from None
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
        if torch:
            raise AgentError(
                f"{where} cannot `import torch` ({last}): set gpu-train:python to a Python with torch, or list torch in "
                "requirements.txt (or, without one, pyproject.toml's dependencies or its uv.lock)"
            )
        raise AgentError(f"{where} does not run ({last})")
    said = result.stdout.strip().splitlines()
    managed = bool(said) and said[-1] == "True"
    torch_file = said[0] if torch and len(said) > 1 else None
    entry = {"python": executable, "managed": managed, "torchFile": torch_file, "torch": fingerprint(torch_file)}
    if executable and (not torch or entry["torch"]):
        with contextlib.suppress(OSError):
            os.makedirs(os.path.join(root, "python"), exist_ok=True)
            write_json(os.path.join(root, PROBED), {**seen, key: entry})
    return managed
