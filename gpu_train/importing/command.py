"""The ``gpu-train train`` command an imported job becomes: the same module with the same arguments,
its output folder handed to the code as AI Platform (``--job-dir``) or Vertex (``AIP_*_DIR``) did.
Apart from the stack's settings (translate.py): it is the part of an import the user runs."""

from __future__ import annotations

import shlex
from typing import Any

from gpu_train.importing.importer import CHANGED, EXACT, NOT_MAPPED, Container, JobDescription, Note

# Vertex's variables for a CustomJob's baseOutputDirectory, with $JOB_DIR in its place.
VERTEX_OUTPUTS = 'AIP_MODEL_DIR="$JOB_DIR/model/" AIP_CHECKPOINT_DIR="$JOB_DIR/checkpoints/" AIP_TENSORBOARD_LOG_DIR="$JOB_DIR/logs/" '


GCS_FUSE = "/gcs/"  # Vertex mounts Cloud Storage there (Cloud Storage FUSE); nothing is mounted there here


def job_env(job: JobDescription) -> dict[str, str]:
    """The job's environment as the platform gave it: the package's env, then the chief container's."""
    chief = job.containers.get("chief")
    return {**job.env, **dict(chief.env if chief else ())}


def train_command(
    job: JobDescription,
    stack: str,
    ps: int,
    notes: list[Note],
    env_file: str | None = None,
    pools: dict[str, dict[str, Any]] | None = None,
    pools_file: str = "POOLS.yaml",
) -> list[str]:
    """`gpu-train train` running the job's module (or its container) with its arguments and environment,
    its output folder handed over as the platform did (``ps``: the last nodes that are TF parameter
    servers, 0 for none). With ``env_file`` the environment's values go there (the caller writes it,
    0600), the command names the file: no value is on a command line or in a shell's history. Pools
    that run another job than the chief's (``pools``: pool_jobs') are named by ``--pools pools_file``."""
    chief = job.containers.get("chief")
    gcs_paths(job, notes)
    if chief is not None and not chief.package:
        argv = own_program(job, chief, stack, ps, notes, env_file)
    else:
        argv = package_command(job, chief, stack, ps, notes, env_file)
    return [*argv, "--pools", pools_file] if pools else argv


def package_command(
    job: JobDescription, chief: Container | None, stack: str, ps: int, notes: list[Note], env_file: str | None
) -> list[str]:
    """The job's Python module (on the host, or inside a prebuilt executor image) with its arguments."""
    argv = ["gpu-train", "train", "--stack", stack]
    if chief is not None:
        argv += ["--image", chief.image]
        notes.append(
            Note(
                "pythonPackageSpec.executorImageUri",
                CHANGED,
                f"{chief.image}: the module runs inside that image, from its synced source folder (not installed from packageUris)",
            )
        )
    if job.package_dir:
        parent = job.package_dir.rstrip("/").rpartition("/")[0] or "."
        argv += ["--dir", parent]
    # The output folder as the platform gave it to the code: AI Platform appends --job-dir to the
    # application's arguments; Vertex sets AIP_MODEL_DIR and its siblings (baseOutputDirectory's subfolders).
    flag = bool(job.job_dir) and not job.output_env
    prefix = VERTEX_OUTPUTS if job.job_dir and job.output_env else ""
    if job.python_module:
        argv += ["--command", module_command(job, job.python_module, job.args)]
        notes.append(Note("pythonModule", EXACT, f"python -m {job.python_module}, from the synced package folder"))
    else:
        argv += (
            ["--command", f"{prefix}python YOUR_SCRIPT.py"]
            if prefix
            else ["--script", "YOUR_SCRIPT.py", *(["--pass-job-dir"] if flag else [])]
        )
        notes.append(Note("pythonModule", NOT_MAPPED, "the job names no Python module: replace YOUR_SCRIPT.py"))
    if job.args:
        notes.append(Note("args", EXACT, shlex.join(job.args)))
    argv += env_flags(job_env(job), env_file, notes)
    if ps:
        argv += ["--ps", str(ps)]
    if job.job_dir:
        copy = (
            (f"; copy results to the bucket with `gcloud storage rsync -r runs/{stack}/RUN {job.job_dir}` after `gpu-train fetch`")
            if job.job_dir.startswith("gs://")
            else ""
        )
        given = "AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR under it" if job.output_env else "--job-dir"
        notes.append(
            Note(
                "baseOutputDirectory" if job.output_env else "jobDir",
                CHANGED,
                f"{job.job_dir} -> $JOB_DIR on the VM (the run's own folder; the code gets {given}, as "
                f"before), fetched home by `gpu-train fetch`{copy}",
            )
        )
    return argv


def env_flags(env: dict[str, str], env_file: str | None, notes: list[Note]) -> list[str]:
    if not env:
        return []
    if env_file:
        notes.append(Note("env", EXACT, f"{', '.join(sorted(env))}: their values in {env_file} (0600), passed to the job by name"))
        return ["--env-file", env_file]
    return [a for key, value in sorted(env.items()) for a in ("--env", f"{key}={value}")]


def own_program(job: JobDescription, chief: Container, stack: str, ps: int, notes: list[Note], env_file: str | None) -> list[str]:
    """A custom container's job: the image's own program, its command replacing ENTRYPOINT and its args CMD."""
    argv = ["gpu-train", "train", "--stack", stack, "--image", chief.image]
    notes.append(Note("containerSpec.imageUri", EXACT, f"{chief.image}: its own program runs, no code is sent (pulled on the VM)"))
    if chief.command:
        argv += ["--entrypoint", shlex.join(chief.command)]
        notes.append(Note("containerSpec.command", EXACT, f"{shlex.join(chief.command)}: replaces the image's ENTRYPOINT"))
    args = list(chief.args) or job.args
    if args:
        argv += ["--args", shlex.join(args)]
        notes.append(Note("containerSpec.args", EXACT, f"{shlex.join(args)}: replace the image's CMD"))
    argv += env_flags(job_env(job), env_file, notes)
    if ps:
        argv += ["--ps", str(ps)]
    if job.job_dir:
        given = "AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR under it" if job.output_env else "$JOB_DIR"
        notes.append(
            Note(
                "baseOutputDirectory" if job.output_env else "jobDir",
                CHANGED,
                f"{job.job_dir} -> $JOB_DIR on the VM (the container gets {given}, mounted at the same path), fetched "
                "home by `gpu-train fetch`",
            )
        )
    return argv


def module_command(job: JobDescription, module: str, args: list[str] | tuple[str, ...]) -> str:
    """``python -m MODULE ARGS``, the output folder handed over as the platform did."""
    flag = bool(job.job_dir) and not job.output_env
    prefix = VERTEX_OUTPUTS if job.job_dir and job.output_env else ""
    return prefix + shlex.join(["python", "-m", module, *args]) + (' --job-dir "$JOB_DIR"' if flag else "")


def pool_job(job: JobDescription, c: Container, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One pool's job in --pools' words (gpu_train/pooljobs.py): its image's own program (command
    replacing ENTRYPOINT, args CMD; AI Platform's job args where the pool gives none), or its Python
    package's module inside the prebuilt image; ``env`` (default: the pool's own) its whole environment."""
    out: dict[str, Any] = {"image": c.image}
    if c.package:
        module = c.module or job.python_module or "YOUR_MODULE"
        out["command"] = module_command(job, module, list(c.args) if c.module else job.args)
    else:
        if c.command:
            out["entrypoint"] = list(c.command)
        if args := list(c.args) or job.args:
            out["args"] = args
    if env := dict(c.env) if env is None else env:
        out["env"] = env
    return out


def pool_jobs(job: JobDescription, notes: list[Note], pools_file: str) -> dict[str, dict[str, Any]]:
    """The worker and parameter-server pools whose container differs from the chief's, each as its own
    job (image, entrypoint and args or command, env): what `train --pools` runs on their nodes."""
    chief = job.containers.get("chief")
    same = pool_job(job, chief, job_env(job)) if chief is not None else None
    pools = {}
    for role in ("worker", "ps"):
        c = job.containers.get(role)
        if c is None or (own := pool_job(job, c)) == same:
            continue
        pools[role] = own
        what = own.get("command") or shlex.join([*own.get("entrypoint", ()), *own.get("args", ())]) or "its ENTRYPOINT and CMD"
        env = f", env {', '.join(sorted(own['env']))}" if own.get("env") else ""
        notes.append(
            Note(
                f"{role} pool's container",
                EXACT,
                f"{c.image}: {what}{env}, on the {role} nodes (--pools {pools_file}, 0600: the values are there)",
            )
        )
    return pools


def gcs_paths(job: JobDescription, notes: list[Note]) -> None:
    """Vertex's /gcs/BUCKET/... paths (Cloud Storage FUSE): named, with what to use instead."""
    words = [*job.args, *job.env.values(), *(w for c in job.containers.values() for w in (*c.command, *c.args, *dict(c.env).values()))]
    found = sorted({w for w in words if GCS_FUSE in w})
    if found:
        notes.append(
            Note(
                "/gcs/ paths",
                CHANGED,
                f"{', '.join(found)[:300]}: Cloud Storage is not mounted at /gcs here. Read data from $DATA_DIR "
                "(gpu-train push, or push --to bucket), write outputs to $JOB_DIR (fetched home; gpu-train:bucket copies them to a bucket)",
            )
        )
