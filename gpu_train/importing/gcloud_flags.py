"""``gcloud ai-platform jobs submit training`` flags, read onto AI Platform's ``trainingInput`` fields.

The flags say what a ``config.yaml`` says (``--config FILE`` is read first, flags win), so they are
turned into a ``trainingInput`` and read by ``importer.read_training_input``: one reading of those
fields. Flags with no gpu-train meaning are noted with what to do instead.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from gpu_train.importing.importer import NOT_MAPPED, JobDescription, JobImportError, Note, Tables, flag_accelerator, read_training_input

_FLAG_FIELDS = {
    "--scale-tier": "scaleTier", "--master-machine-type": "masterType", "--worker-machine-type": "workerType",
    "--worker-count": "workerCount", "--parameter-server-machine-type": "parameterServerType",
    "--parameter-server-count": "parameterServerCount", "--region": "region", "--module-name": "pythonModule",
    "--job-dir": "jobDir", "--runtime-version": "runtimeVersion", "--python-version": "pythonVersion",
}  # fmt: skip
_FLAG_ACCEL = {
    "--master-accelerator": "masterConfig",
    "--worker-accelerator": "workerConfig",
    "--parameter-server-accelerator": "parameterServerConfig",
}
_FLAG_IMAGES = {
    "--master-image-uri": "masterConfig",
    "--worker-image-uri": "workerConfig",
    "--parameter-server-image-uri": "parameterServerConfig",
}
_FLAG_IGNORED = {
    "--staging-bucket": "the code is synced over SSH, no bucket is needed",
    "--stream-logs": "use `gpu-train train --follow` or `gpu-train logs --follow`",
    "--async": "gpu-train train returns once the job started",
    "--labels": "put VM labels in gpu-train:labels if you want them",
    "--packages": "packages are not downloaded: run the train command from the package's source folder",
    "--kms-key": "not supported", "--kms-keyring": "not supported", "--kms-location": "not supported",
    "--kms-project": "not supported", "--service-account": "the VM gets its own minimal service account",
    "--network": "the VM uses the project's network (gpu-train:network)",
    "--enable-web-access": "use `gpu-train tunnel` / `gpu-train tensorboard`",
}  # fmt: skip
_FLAG_SWITCHES = {"--use-chief-in-tf-config", "--async", "--stream-logs", "--enable-web-access"}


def _strip_gcloud_prefix(argv: list[str]) -> list[str]:
    """Drop ``gcloud ai-platform jobs submit training JOB_NAME`` (or part of it) from the front."""
    words = ["gcloud", "beta", "ai-platform", "jobs", "submit", "training"]
    rest = list(argv)
    while rest and rest[0] in words:
        rest.pop(0)
    if rest and not rest[0].startswith("-"):  # the job's name
        rest.pop(0)
    return rest


def read_gcloud_args(argv: list[str], tables: Tables, load_config: Callable[[str], Any] | None = None) -> JobDescription:
    """``gcloud ai-platform jobs submit training`` flags; ``--config FILE`` is read first, flags win.

    ``load_config`` reads the YAML file named by --config (passed in, so this stays pure).
    """
    args = _strip_gcloud_prefix(argv)
    user_args: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, user_args = args[:cut], args[cut + 1 :]
    ti: dict[str, Any] = {}
    notes: list[Note] = []
    package_dir = project = None
    i = 0
    while i < len(args):
        word = args[i]
        name, eq, inline = word.partition("=")
        if not name.startswith("--"):
            raise JobImportError(f"unexpected word {word!r}: user arguments go after `--`")
        if name in _FLAG_SWITCHES:
            if name == "--use-chief-in-tf-config":
                ti["useChiefInTfConfig"] = inline.lower() != "false" if eq else True
            else:
                notes.append(Note(name, NOT_MAPPED, _FLAG_IGNORED[name]))
            i += 1
            continue
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(args):
            value, i = args[i + 1], i + 2
        else:
            raise JobImportError(f"{name} needs a value")
        if name == "--config":
            if load_config is None:
                raise JobImportError("--config FILE: no file reader given")
            loaded = load_config(value)
            base = loaded.get("trainingInput", loaded) if isinstance(loaded, dict) else None
            if not isinstance(base, dict):
                raise JobImportError(f"--config {value}: expected trainingInput in the file")
            ti = {**base, **ti}
        elif name in _FLAG_FIELDS:
            ti[_FLAG_FIELDS[name]] = value
        elif name in _FLAG_ACCEL:
            kind, count = flag_accelerator(value, name)
            ti.setdefault(_FLAG_ACCEL[name], {})["acceleratorConfig"] = {"type": kind, "count": count}
        elif name in _FLAG_IMAGES:  # AI Platform's custom container for that replica, as in config.yaml
            ti.setdefault(_FLAG_IMAGES[name], {})["imageUri"] = value
        elif name == "--package-path":
            package_dir = value
        elif name == "--project":
            project = value
        elif name in _FLAG_IGNORED:
            notes.append(Note(name, NOT_MAPPED, _FLAG_IGNORED[name]))
        else:
            notes.append(Note(name, NOT_MAPPED, "not a setting gpu-train knows; it is left out"))
    if "scaleTier" in ti:
        ti["scaleTier"] = str(ti["scaleTier"]).upper().replace("-", "_")
    job = read_training_input(ti, tables)
    job.notes = notes + job.notes
    job.args += user_args
    job.package_dir = package_dir
    job.project = project
    return job


def split_gcloud_command(text: str) -> list[str]:
    """A pasted gcloud command line (with backslash line continuations) as words."""
    return shlex.split(text.replace("\\\n", " "))
