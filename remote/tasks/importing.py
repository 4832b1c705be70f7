"""`gpu-train import`: an AI Platform or Vertex AI job becomes a stack file and a train command.

The reading and translating are pure (``gpu_train.importing.importer``, ``gpu_train.importing.translate``); this task
reads the input, validates the stack exactly as `scripts/plan` does, writes the stack file (never
over an existing one unless --force, and atomically), and prints the report and the command.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from invoke import Context, task

from gpu_train.atomic import atomic_write
from gpu_train.environment import Environment
from gpu_train.errors import UsageError, printable
from gpu_train.stack.problems import ConfigError
from gpu_train.stack.project import repo_script
from remote.tasks.session import say
from remote.tasks.taskoptions import ImportOptions


def _read_yaml(path: str) -> object:  # (any YAML: importer.read_any says what it is not)
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is not YAML or JSON: {e}") from None


def _write_stack(path: Path, settings: dict[str, Any], source: str, stack: str, force: bool) -> None:
    import yaml

    if path.exists() and not force:
        raise UsageError(f"{path} exists: pass --force to replace it, or choose another --stack")
    header = (
        f"# Written by `gpu-train import` from {source}.\n"
        f"# Edit what the report marks 'not mapped', then: {repo_script('plan')} --stack {stack}\n"
    )
    text = header + yaml.safe_dump({"config": settings}, sort_keys=False, default_flow_style=False)
    atomic_write(path, text, mode=0o644)


def _write_env(path: Path, env: dict[str, str]) -> None:
    """The job's environment as an --env-file (0600, in the user's own state folder, never the stack file)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    quoted = {k: '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"' for k, v in env.items()}
    atomic_write(path, "".join(f"{k}={v}\n" for k, v in sorted(quoted.items())), mode=0o600, keep_mode=False)


def _write_pools(path: Path, pools: dict[str, Any], source: str) -> None:
    """The worker and ps pools' own jobs as `train --pools` reads them (0600: their env values are there)."""
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    header = f"# Written by `gpu-train import` from {source}: what each pool's nodes run (node 0 runs the train command's job).\n"
    atomic_write(path, header + yaml.safe_dump(pools, sort_keys=False, default_flow_style=False), mode=0o600, keep_mode=False)


@task(
    name="import",
    positional=["source"],
    iterable=["ssh_from"],
    help={
        "source": "an AI Platform config.yaml (trainingInput) or a Vertex AI CustomJob / CustomJobSpec (YAML or "
        "JSON); or the word gcloud, with gcloud's command after `--` (or in --gcloud)",
        "gcloud": "with source gcloud: the `gcloud ai-platform jobs submit training ...` command, quoted",
        "stack": "name of the stack to write (default: the file's name)",
        "region": "region when the input names none (Vertex specs do not); default us-central1",
        "project": "the Google Cloud project for the stack (gcp:project)",
        "ssh_from": 'a CIDR allowed to SSH to the VM (repeatable), e.g. "$(curl -s ifconfig.me)/32"',
        "stacks_dir": "where to write Pulumi.STACK.yaml (default: the stacks directory in use)",
        "force": "replace an existing stack file",
        "json": "print the stack, the command and the report as JSON",
    },
)
def import_job(
    c: Context,
    source: str,
    gcloud: str | None = None,
    stack: str | None = None,
    region: str | None = None,
    project: str | None = None,
    ssh_from: str | None = None,
    stacks_dir: str | None = None,
    force: bool = False,
    json: bool = False,
) -> None:
    """Translate an AI Platform or Vertex AI training job into a stack and the train command that runs it.

    gpu-train import config.yaml --stack aip --project my-proj --ssh-from 203.0.113.7/32
    gpu-train import gcloud --stack aip -- gcloud ai-platform jobs submit training JOB --scale-tier basic-gpu ... -- ARGS
    gpu-train import gcloud --stack aip --gcloud "gcloud ai-platform jobs submit training JOB ... -- ARGS"

    Every field of the job is reported: mapped exactly, mapped with a change (and why), or not mapped
    (and what to do). The stack is validated as `scripts/plan` validates it, before it is written.
    """
    o = ImportOptions.read(
        source,
        gcloud=gcloud,
        argv=sys.argv,
        stack=stack,
        region=region,
        project=project,
        ssh_from=ssh_from,
        stacks_dir=stacks_dir,
        force=bool(force),
        as_json=bool(json),
    )
    import_with(Environment.of(c), o)


def import_with(env: Environment, o: ImportOptions) -> None:
    """`import`'s work for checked options: read and translate the job, check the stack as `scripts/plan`
    does, write it (and the job's env and pools files), say the report and the train command."""
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.gcp import validate
    from gpu_train.importing import gcloud_flags, importer, translate

    file, region, stack = o.file, o.region, o.stack
    catalog, tables = load_catalog(), importer.load_tables()
    try:
        if file:
            job = importer.read_any(_read_yaml(file), tables, region)
            origin, name = file, Path(file).stem
        else:
            job = gcloud_flags.read_gcloud_args(list(o.gcloud), tables, _read_yaml)
            job.region = job.region or region
            origin, name = "gcloud ai-platform jobs submit training", "imported"
        stack_name = stack or name.replace("_", "-")
        imports = env.state_home / "imports"  # the job's env values: 0600, not the stack
        env_file, pools_file = imports / f"{stack_name}.env", imports / f"{stack_name}.pools.yaml"
        result = translate.translate(job, stack_name, catalog, tables, o.project, o.ssh_from, str(env_file), str(pools_file))
    except importer.JobImportError as e:
        raise UsageError(f"cannot import {file or 'the gcloud command'}: {e}") from None
    try:
        _, problems = validate.check(result.settings, stack_name, catalog)
    except ConfigError as e:
        problems = e.problems
    directory = Path(o.stacks_dir).expanduser() if o.stacks_dir else env.new_stacks_dir
    path = directory / f"Pulumi.{stack_name}.yaml"
    _write_stack(path, result.settings, origin, stack_name, o.force)
    if result.env:
        _write_env(env_file, result.env)
    if result.pools:
        _write_pools(pools_file, result.pools, origin)
    errors = [p for p in problems if p.severity == "error"]
    if o.as_json:
        import json

        print(
            json.dumps(
                {
                    "stackFile": str(path),
                    "settings": result.settings,
                    "train": result.train,
                    "report": [{"field": n.field, "status": n.status, "detail": n.detail} for n in result.notes],
                    "problems": [str(p) for p in problems],
                },
                indent=1,
            )
        )
        return
    print(f"wrote {path}")
    print("\nReport (exact = same as the job; changed = mapped differently, and why; not mapped = what to do):")
    for note in result.notes:  # a job config's words: its escape sequences written out, never sent to the terminal
        print(f"  {printable(str(note))}")
    if errors:
        print(f"\nBefore `{repo_script('plan')} --stack {stack_name}` passes, change ({len(errors)}):")
        for p in errors:
            print(printable(f"  - {p}", keep="\n").replace("\n", "\n    "))
    else:
        print(f"\nThe stack is valid: {repo_script('plan')} --stack {stack_name} shows what it creates and costs.")
    print("\nThen run the same job:\n  " + printable(shlex.join(result.train)))
    from remote.tasks.starter import doc_page

    say(f"(pulumi up first creates the VMs: gpu-train up --stack {stack_name}; {doc_page('importing.md')})")


import_job.remainder_kwarg = "gcloud"  # `gpu-train import -- gcloud ...` (remote/cli.py's Executor)
