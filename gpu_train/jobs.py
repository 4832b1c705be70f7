"""Pure decisions about jobs: run ids, what to launch, one state for a run across nodes."""

from __future__ import annotations

import base64
import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from gpu_train.contract import (  # the contract with the host, written once
    ACTIVE,
    FAILED,
    IN_JOB_DIR,
    INTERRUPTED,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    JobSpec,
    is_run_id,
)
from gpu_train.jobargs import JobError as JobError  # (the options' checks: named here too, where callers find them)
from gpu_train.jobargs import container_spec, parse_env, split_args
from gpu_train.jobargs import parse_env_file as parse_env_file
from gpu_train.stack.bucket import data_prefix, parse_bucket, parts_prefix, run_prefix

STAMP_LEN = len("_20260101_000000")


def base_name(name: str | None, script: str | None, command: str | None) -> str:
    """The run's base name: --name, else the script's stem, else 'job'; made to fit the rule."""
    raw = name or (Path(script).stem if script else "job")
    if name is not None and not is_run_id(name.replace("-", "_")):
        raise JobError(f"--name {name!r}: use letters, digits, '-' and '_', starting with a letter")
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", raw)
    if not cleaned[:1].isalpha():
        cleaned = "job_" + cleaned
    return cleaned[: 128 - STAMP_LEN]


def check_run_id(text: object, where: str = "--run") -> str:
    """``text`` if it is a run id, else JobError: ids from a host or the command line become local
    and remote paths (runs/STACK/ID), so anything else (``..``, ``/``) is refused, never cleaned."""
    if is_run_id(text):
        return text
    shown = repr(text)
    shown = shown if len(shown) <= 80 else f"{shown[:80]}... ({len(shown)} characters)"
    raise JobError(f"{where} {shown} is not a run id (letters, digits and underscores, starting with a letter, at most 128)")


def run_id(base: str, when: datetime) -> str:
    rid = f"{base}_{when:%Y%m%d_%H%M%S}"
    assert is_run_id(rid), rid
    return rid


def job_spec(
    *,
    run: str,
    base: str,
    script: str | None,
    command: str | None,
    args: str,
    env: list[str],
    python: str | None,
    expect_gpus: int,
    code_dir: Path,
    cwd: Path | None = None,
    environ: Mapping[str, str] | None = None,
    env_files: Mapping[str, str] | None = None,
    pass_job_dir: bool = False,
    resume_args: str = "",
    resume_if: str | None = None,
    image: str | None = None,
    entrypoint: str = "",
) -> JobSpec:
    """Check train's options against the code directory; build what the host runs.

    ``cwd`` is where the user is: a relative --script is a path in ``code_dir`` (the project root),
    and one that names a file from ``cwd`` instead gets the path to use. ``environ`` is the laptop's
    environment (for ``--env NAME``), ``env_files`` the ``--env-file`` texts by name. ``image``: the job
    runs in that container image, the project's --script/--command inside it, or without them the
    image's own program (``entrypoint`` and --args replace its ENTRYPOINT and CMD, as on Vertex AI)."""
    if resume_if and "$" in resume_if and not resume_if.startswith(IN_JOB_DIR):
        raise JobError(
            f"--resume-if {resume_if}: no variable is expanded there but a leading $JOB_DIR/: give a path in the working "
            "directory (out/ckpt.pt) or in JOB_DIR, in single quotes ('$JOB_DIR/ckpt.pt')"
        )
    container = container_spec(image, entrypoint, script, command, args, pass_job_dir)
    if container is not None and container.own_program:
        return JobSpec(
            run_id=run,
            base=base,
            env=parse_env(env, environ, env_files),
            python=python,
            expect_gpus=expect_gpus,
            resume_args=split_args("--resume-args", resume_args),
            resume_if=resume_if or None,
            container=container,
        )
    if bool(script) == bool(command):
        raise JobError("give exactly one of --script FILE or --command CMD (or --image IMAGE alone: the image's own program)")
    if pass_job_dir and not script:
        raise JobError('--pass-job-dir goes with --script; a --command passes it itself: --job-dir "$JOB_DIR"')
    if resume_if and not resume_args:
        raise JobError(
            "--resume-if says when to add --resume-args: give both (e.g. --resume-args '--init_from=resume' --resume-if out/ckpt.pt)"
        )
    if script:
        rel = Path(script)
        if rel.is_absolute():
            try:
                rel = rel.relative_to(code_dir.resolve())
            except ValueError:
                raise JobError(f"--script {script}: the script must be inside --dir {code_dir}") from None
        if not (code_dir / rel).is_file():
            raise JobError(missing_script(script, code_dir, cwd, script_candidates(code_dir)))
        script = rel.as_posix()
        if script.startswith("-"):  # `--script -V` is a file named -V, never an option of Python's
            script = f"./{script}"
    elif args:
        raise JobError("--args goes with --script; with --command, put the arguments in the command")
    return JobSpec(
        run_id=run,
        base=base,
        script=script,
        command=command,
        args=split_args("--args", args),
        env=parse_env(env, environ, env_files),
        python=python,
        expect_gpus=expect_gpus,
        pass_job_dir=pass_job_dir,
        resume_args=split_args("--resume-args", resume_args),
        resume_if=resume_if or None,
        container=container,
    )


SKIPPED_DIRS = {".git", "runs", ".gpu-train", "node_modules", "__pycache__", ".venv", "venv"}


def script_candidates(code_dir: Path, limit: int = 5000) -> list[str]:
    """The Python files under ``code_dir`` (paths relative to it), for a "did you mean": hidden
    directories, virtual environments and fetched runs left out, at most ``limit`` looked at."""
    found: list[str] = []
    for here, dirs, files in os.walk(code_dir):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("."))
        rel = Path(here).relative_to(code_dir)
        found += [(rel / f).as_posix() for f in sorted(files) if f.endswith(".py")]
        if len(found) >= limit:
            break
    return found[:limit]


def missing_script(script: str, code_dir: Path, cwd: Path | None, candidates: list[str]) -> str:
    """Why --script names no file, and the path that would: --script is relative to the project
    root (``code_dir``), not to the directory the user is in. Pure but for the one look at ``cwd``."""
    text = f"--script {script}: no such file in {code_dir}, the folder the job runs in (--script paths are relative to it)"
    if cwd is not None and (cwd / script).is_file():
        try:
            inside = (cwd / script).resolve().relative_to(code_dir.resolve()).as_posix()
        except ValueError:
            return f"{text}; {cwd / script} is outside it: the script must be in the code that is synced"
        return f"{text}; from here, use --script {inside}"
    by_name = [c for c in candidates if Path(c).name == Path(script).name]
    close = (
        by_name[:3]
        or difflib.get_close_matches(script, candidates, n=3, cutoff=0.6)
        or [
            c
            for c in candidates
            if Path(c).name in difflib.get_close_matches(Path(script).name, [Path(c).name for c in candidates], n=3, cutoff=0.6)
        ][:3]
    )
    return f"{text}; did you mean {' or '.join(close)}?" if close else text


TORCH_IMPORT_RE = re.compile(r"^\s*(import torch\b|from torch\b)", re.M)
TORCH_REQUIREMENT_RE = re.compile(r"^\s*torch(?![\w.-])", re.M | re.I)  # torch, torch==2.4; not torch-geometric
TORCH_PYPROJECT_RE = re.compile(r"""(?:^|[\[,])\s*["']torch(?![\w.-])""", re.M | re.I)  # an item of [project] dependencies
DEPENDENCY_FILES = ("requirements.txt", "pyproject.toml", "uv.lock")  # what the host installs from (agent/pyenv.py)
TORCH_LOCK_RE = re.compile(r'^name = "torch"$', re.M)  # a [[package]] of uv.lock


def installs_torch(files: Mapping[str, str]) -> bool:
    """Whether the code's dependency files (name -> text) install torch, read as the host reads them
    (agent/pyenv.py's install_plan): requirements.txt when there is one; else uv.lock with its
    pyproject.toml; else pyproject.toml's dependencies."""
    if "requirements.txt" in files:
        return bool(TORCH_REQUIREMENT_RE.search(files["requirements.txt"]))
    if "pyproject.toml" not in files:
        return False
    if "uv.lock" in files:
        return bool(TORCH_LOCK_RE.search(files["uv.lock"]))
    return bool(TORCH_PYPROJECT_RE.search(files["pyproject.toml"]))


def needs_torch(code_dir: Path, script: str | None, launcher: str) -> bool:
    """Whether `fab train` must find torch in the host's Python before it says "started": torchrun
    needs it, and so does a script that imports it, unless the project's dependencies install it."""
    files = {name: (code_dir / name).read_text(errors="replace") for name in DEPENDENCY_FILES if (code_dir / name).is_file()}
    if installs_torch(files):
        return False
    if launcher == "torchrun":
        return True
    if not script:
        return False
    try:
        return bool(TORCH_IMPORT_RE.search((code_dir / script).read_text(errors="replace")))
    except OSError:
        return False


def encode_spec(spec: JobSpec) -> str:
    return base64.b64encode(json.dumps(spec.to_json()).encode()).decode()


def choose_launcher(option: str | None, nodes: int, script: str | None) -> str:
    """torchrun by default for a multi-node --script; otherwise what was asked (none by default)."""
    chosen = option or ("torchrun" if script and nodes > 1 else "none")
    if chosen not in ("torchrun", "none"):
        raise JobError(f"--launcher {chosen!r}: use torchrun or none")
    if chosen == "torchrun" and not script:
        raise JobError("--launcher torchrun runs a --script; a --command gets MASTER_ADDR, NODE_RANK, TF_CONFIG, ...")
    return chosen


def node_specs(spec: JobSpec, hosts: list[str], master_addr: str, master_port: int, ps: int, tf_port: int = 2222) -> list[JobSpec]:
    """One spec per node: its rank, and where the cluster meets (node 0 leads)."""
    nnodes = len(hosts)
    if not 0 <= ps < nnodes:
        raise JobError(f"--ps {ps}: needs 0 to {nnodes - 1} parameter servers for {nnodes} nodes (node 0 is the chief)")
    if nnodes == 1 and spec.launcher != "torchrun":
        return [spec]
    return [
        replace(
            spec,
            node={
                "rank": i,
                "nnodes": nnodes,
                "masterAddr": master_addr,
                "masterPort": master_port,
                "hosts": hosts,
                "tfPort": tf_port,
                "ps": ps,
            },
        )
        for i in range(nnodes)
    ]


def in_bucket(specs: list[JobSpec], area: str, bucket: str | None, data: tuple[dict[str, Any], ...] = ()) -> list[JobSpec]:
    """With gpu-train:bucket, each node's spec names where its JOB_DIR goes: PREFIX/.gpu-train-runs/AREA/RUN/ (node N > 0:
    .../node-N/; AREA: gpu_train.stack.bucket.area_of), and ``data``: the manifests of `push --to bucket` (the only data a
    host copies from it)."""
    if not bucket:
        return specs
    place = parse_bucket(bucket)
    return [
        replace(
            s,
            bucket={
                "name": place.name,
                "prefix": run_prefix(place, area, s.run_id, i),
                "data": data_prefix(place, s.project),
                "parts": parts_prefix(place, area, s.run_id, i),
            },
            bucket_data=data,
        )
        for i, s in enumerate(specs)
    ]


def parameter_servers(option: object, from_pools: int) -> int:
    """--ps as given, else the stack's ps pool; a --ps that contradicts the pools is refused."""
    if option is None or option == "":
        return from_pools
    try:
        ps = int(str(option))
    except ValueError:
        raise JobError(f"--ps {option!r}: expected a whole number") from None
    if from_pools and ps != from_pools:
        raise JobError(
            f"--ps {ps}: the stack's pools make the last {from_pools} nodes parameter servers; leave --ps out (or change the pools)"
        )
    return ps


def per_node_gpus(specs: list[JobSpec], node_gpus: list[int], launcher: str, nproc_given: bool) -> list[JobSpec]:
    """Pools: each node waits for its own GPUs and, under torchrun, runs one process per GPU it has
    (torchrun ranks over nodes of different GPU counts). torchrun on a CPU-only node is refused."""
    if not node_gpus or len(node_gpus) != len(specs):
        return specs
    if launcher == "torchrun" and 0 in node_gpus:
        cpu = [i for i, n in enumerate(node_gpus) if n == 0]
        raise JobError(
            f"--script runs under torchrun on every node, and node{'s' if len(cpu) > 1 else ''} "
            f"{', '.join(map(str, cpu))} (the ps pool) have no GPU: run a TF parameter-server job with "
            "--command (it gets TF_CONFIG), or remove the ps pool for a PyTorch job"
        )
    return [replace(s, expect_gpus=n, nproc=s.nproc if nproc_given else (n or s.nproc)) for s, n in zip(specs, node_gpus, strict=True)]


def aggregate_state(per_node: list[dict[str, Any] | None]) -> tuple[str, int | None, str]:
    """One state for a run across its nodes: (state, exit code, which node did what).

    Failed if any node failed (or lost the run), interrupted if any was, running while any runs,
    stopped if any was stopped, succeeded when all did.
    """
    notes = []
    for i, r in enumerate(per_node):
        if r is None:
            notes.append(f"node {i}: no such run")
        elif r["state"] == FAILED:
            notes.append(f"node {i} failed" + (f" (exit {r['exitCode']})" if r.get("exitCode") is not None else ""))
        elif r["state"] == INTERRUPTED:
            notes.append(f"node {i} interrupted")
    states = [r["state"] if r else FAILED for r in per_node]
    codes = [r.get("exitCode") for r in per_node if r and r["state"] == FAILED]
    for state in (FAILED, INTERRUPTED):
        if state in states:
            return state, next((c for c in codes if c is not None), None), "; ".join(notes)
    if any(s in ACTIVE for s in states):
        return RUNNING, None, "; ".join(f"node {i} {s}" for i, s in enumerate(states) if s not in ACTIVE)
    if STOPPED in states:
        return STOPPED, None, ""
    return SUCCEEDED, 0, ""


def resumable(runs: list[dict[str, Any]], command: str) -> str:
    """The run `resume` takes without --run: the newest interrupted one (on a cluster, one that any
    node lost to an interruption), never one that finished; JobError naming the runs otherwise, with
    ``command`` (`gpu-train resume --stack S`) and the newest's --run to restart it anyway."""

    def interrupted(r: dict[str, Any]) -> bool:
        return r["state"] == INTERRUPTED or any(n.get("state") == INTERRUPTED for n in r.get("nodes") or ())

    candidates = [r for r in runs if interrupted(r)]
    if candidates:
        latest: str = max(candidates, key=lambda r: r.get("created") or 0)["id"]
        return latest
    if not runs:
        raise JobError("no runs on this host yet: nothing to resume")
    newest = max(runs, key=lambda r: r.get("created") or 0)
    raise JobError(
        f"no interrupted run to resume (the newest, {newest['id']}, is {newest['state']}); "
        f"to restart it anyway: {command} --run {newest['id']}"
    )


def aggregate_runs(docs: list[dict[str, Any] | None]) -> dict[str, Any]:
    """Node 0's status document, with each run's state made the cluster's and each node's listed."""
    lead = docs[0] or {"runs": [], "gpus": [], "agent": {}}
    by_node = [{r["id"]: r for r in d["runs"]} if d else None for d in docs]
    runs = []
    for r in lead["runs"]:
        per_node = [(m or {}).get(r["id"]) if m is not None else None for m in by_node]
        state, code, detail = aggregate_state(per_node)
        nodes = [
            {"node": i, "state": p["state"] if p else "unknown", "exitCode": p.get("exitCode") if p else None}
            for i, p in enumerate(per_node)
        ]
        runs.append({**r, "state": state, "exitCode": code, "detail": detail, "nodes": nodes})
    return {**lead, "runs": runs, "nodeCount": len(docs)}
