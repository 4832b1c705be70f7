"""What `train`'s options say, checked on the laptop: the job's environment (``--env``, ``--env-file``),
arguments split as a shell would, and ``--image`` (the container a run uses). Pure; ``gpu_train.jobs``
builds the job spec from them."""

from __future__ import annotations

import io
import re
import shlex
from collections.abc import Mapping

from gpu_train.containerspec import IMAGE_REF_PATTERN, ContainerSpec
from gpu_train.contract import RESUMES_ENV
from gpu_train.errors import UsageError


class JobError(UsageError, ValueError):
    """A job's options are invalid; the message says which and how to fix it."""


ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV = ("JOB_DIR", "RUN_ID", "DATA_DIR", RESUMES_ENV)  # gpu-train sets these itself


def parse_env(pairs: list[str], environ: Mapping[str, str] | None = None, files: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's environment from ``--env-file`` texts (``files``: name -> text, in order) and ``--env``
    (NAME=VALUE, or NAME alone: its value from ``environ``, the laptop's, so a secret stays off the
    command line). ``--env`` wins over a file; a later file over an earlier one."""
    env: dict[str, str] = {}
    for name, text in (files or {}).items():
        env.update(parse_env_file(text, name))
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not ENV_NAME_RE.fullmatch(key):
            raise JobError(f"--env {pair if sep else key!r}: write it as NAME=VALUE, or NAME to pass this shell's $NAME")
        if not sep:
            if environ is None or key not in environ:
                raise JobError(
                    f"--env {key}: {key} is not set in this shell's environment; export it first "
                    f"(export {key}=...), or give it in an --env-file"
                )
            value = environ[key]
        env[key] = value
    if taken := [k for k in env if k in RESERVED_ENV]:
        raise JobError(f"--env {taken[0]}: gpu-train sets {taken[0]} itself")
    return env


def parse_env_file(text: str, name: str) -> dict[str, str]:
    """``--env-file``'s ``NAME=VALUE`` lines, read by python-dotenv's parser (the dotenv format as the
    tools that write these files mean it): blank lines and ``#`` comments skipped, an optional ``export``,
    a value in single quotes taken as it is, in double quotes with its escapes (``\\"``, ``\\\\``,
    ``\\n``, ...) unescaped, unquoted with surrounding spaces and a trailing `` # comment`` dropped; a
    quoted value may span lines. No ``${VAR}`` expansion (the parser alone does none). A line it cannot
    read, or a name that is not an environment variable's, is an error naming the line."""
    from dotenv.parser import parse_stream

    env: dict[str, str] = {}
    for binding in parse_stream(io.StringIO(text)):
        line = binding.original.line
        if binding.error or (binding.key is not None and binding.value is None):
            raise JobError(
                f"--env-file {name}, line {line}: expected NAME=VALUE (a line that starts with # is a comment; "
                "a quoted value ends with its quote)"
            )
        if binding.key is None:
            continue  # a blank line or a comment
        if not ENV_NAME_RE.fullmatch(binding.key):
            raise JobError(f"--env-file {name}, line {line}: {binding.key[:40]!r} is not a variable name (letters, digits, _)")
        env[binding.key] = binding.value or ""
    return env


IMAGE_RE = re.compile(IMAGE_REF_PATTERN)
NO_IMAGE = "none"  # `--image none`: on the host itself, whatever gpu-train:image says


def container_spec(
    image: str | None, entrypoint: str, script: str | None, command: str | None, args: str, pass_job_dir: bool
) -> ContainerSpec | None:
    """``--image`` (or the stack's gpu-train:image) as the host runs it; None to run on the host."""
    if not image or image == NO_IMAGE:
        if entrypoint:
            raise JobError("--entrypoint replaces an image's ENTRYPOINT: give --image IMAGE too")
        return None
    if not IMAGE_RE.fullmatch(image):
        raise JobError(
            f"--image {image[:100]!r}: not an image reference; write REGISTRY/NAME:TAG or NAME@sha256:DIGEST "
            "(e.g. nvcr.io/nvidia/pytorch:24.05-py3), lowercase"
        )
    if script or command:
        if entrypoint:
            raise JobError("--entrypoint goes with the image's own program: leave out --script/--command, or --entrypoint")
        return ContainerSpec(image=image)
    if pass_job_dir:
        raise JobError('--pass-job-dir goes with --script; the image\'s own program gets it in --args: --args "--job-dir $JOB_DIR"')
    return ContainerSpec(image=image, own_program=True, entrypoint=split_args("--entrypoint", entrypoint), args=split_args("--args", args))


def split_args(option: str, text: str) -> tuple[str, ...]:
    """An option's arguments, split as a shell would."""
    try:
        return tuple(shlex.split(text or ""))
    except ValueError as e:
        raise JobError(
            f"{option} {text[:80]!r}: {e.args[0].lower()}; the arguments are split as a shell would, "
            f'so close each quote (an apostrophe inside double quotes: {option} "--title \\"it\'s\\"")'
        ) from None
