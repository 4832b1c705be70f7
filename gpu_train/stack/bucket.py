"""`gpu-train:bucket`: where in Cloud Storage a stack's runs go, checked before anything is created.

``NAME`` or ``gs://NAME/PREFIX``; a run's files are objects under ``PREFIX/.gpu-train-runs/AREA/RUN/`` (node
N > 0 of a cluster: ``.../RUN/node-N/``), the same shape as the laptop's ``runs/STACK/RUN/``. AREA is the
stack's ``bucketArea``, ``STACK@XXXXXXXX`` (its name and 8 random hex digits, made once and kept in the stack
file, so it travels with the project's stacks/ to another laptop or clone): two stacks of one name on one
prefix (two people's ``lab`` in a team bucket) have two areas. A stack without one (from before 2026-11-28)
still has ``STACK`` as its area; ``@`` is no stack name's, so no area is another's. Every area
gpu-train writes starts with a ``.gpu-train-*`` folder right after PREFIX, and no PREFIX may hold a folder of
that name, so one stack's area is never inside another's (a stack ``team`` on ``gs://B`` beside a stack on
``gs://B/team``) and a grant over one (``startsWith``) covers nothing of another. Pure: the program,
the laptop's tasks and the host's uploader (through the job spec) all take the names from here.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from dataclasses import dataclass

from gpu_train.contract import STACK_NAME_PATTERN
from gpu_train.stack.problems import Problem

SCHEME = "gs://"
RESERVED = ".gpu-train"  # gpu-train's folders in a bucket (RUNS_FOLDER, PARTS_FOLDER, DATA_FOLDER): no prefix has one
# Google's naming rules (cloud.google.com/storage/docs/buckets#naming): lowercase letters, digits,
# dashes, underscores and dots; start and end with a letter or digit; 3-63 characters (up to 222 with
# dots, each dot-separated part at most 63); not an IP address; no "goog" prefix, no "google" inside.
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*[a-z0-9]")
MAX_OBJECT_NAME = 1024  # bytes of UTF-8 (Cloud Storage's limit); RUN and file names come after the prefix
MAX_PREFIX = 512  # leaves the other half to STACK/RUN/<path>


@dataclass(frozen=True)
class BucketPlace:
    """A bucket and the prefix (empty, or ending in ``/``) every stack's runs go under."""

    name: str
    prefix: str = ""

    def url(self, path: str = "") -> str:
        return f"{SCHEME}{self.name}/{self.prefix}{path}"


def name_problem(name: str) -> str | None:
    """What is wrong with a bucket name, or None."""
    if not _NAME.fullmatch(name):
        return "a bucket name is lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
    parts = name.split(".")
    if len(name) < 3 or len(name) > (222 if len(parts) > 1 else 63) or any(len(p) > 63 for p in parts):
        return "a bucket name has 3 to 63 characters (up to 222 with dots, each dotted part at most 63)"
    try:
        ipaddress.ip_address(name)
        return "a bucket name cannot be an IP address"
    except ValueError:
        pass
    if name.startswith("goog") or "google" in name or "g00gle" in name:
        return "a bucket name cannot start with 'goog' or contain 'google'"
    return None


def parse_bucket(text: str) -> BucketPlace:
    """``NAME`` or ``gs://NAME[/PREFIX]`` -> a BucketPlace; ValueError saying what is wrong."""
    rest = text.strip().removeprefix(SCHEME)
    name, _, prefix = rest.partition("/")
    if (why := name_problem(name)) is not None:
        raise ValueError(why)
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") for p in parts) or any(ord(c) < 32 or c in "\x7f#[]*?" for c in prefix):
        raise ValueError("the prefix is folder names without '.', '..', control characters or # [ ] * ?")
    if any(p.startswith(RESERVED) for p in parts):
        raise ValueError(f"a prefix's folder cannot start with {RESERVED!r}: gpu-train's own folders are named so")
    joined = "".join(f"{p}/" for p in parts)
    if len(joined.encode()) > MAX_PREFIX:
        raise ValueError(f"the prefix is at most {MAX_PREFIX} bytes (an object name is at most {MAX_OBJECT_NAME})")
    return BucketPlace(name, joined)


def bucket_problems(text: str | None, create: bool) -> list[Problem]:
    """The problems of ``bucket`` (and ``bucketCreate`` without it), each naming the fix."""
    if text is None:
        return (
            [
                Problem(
                    "bucketCreate",
                    "needs gpu-train:bucket (the bucket's name)",
                    "pulumi config set gpu-train:bucket NAME, or remove gpu-train:bucketCreate",
                )
            ]
            if create
            else []
        )
    try:
        parse_bucket(text)
    except ValueError as e:
        return [
            Problem(
                "bucket",
                str(e),
                "pulumi config set gpu-train:bucket NAME (or gs://NAME/PREFIX), e.g. gs://my-team-checkpoints/gpu-train",
                text,
            )
        ]
    return []


RUNS_FOLDER = ".gpu-train-runs/"
PARTS_FOLDER = ".gpu-train-parts/"
AREA_KEY = "bucketArea"  # the stack setting that keeps a stack's area
AREA_RE = re.compile(rf"{STACK_NAME_PATTERN}@[0-9a-f]{{8}}")


def new_area(stack: str, token: str | None = None) -> str:
    """A fresh area for ``stack``: ``STACK@XXXXXXXX`` (``token`` for the tests)."""
    made = f"{stack}@{token or secrets.token_hex(4)}"
    assert AREA_RE.fullmatch(made), made
    return made


def area_problems(area: object) -> list[Problem]:
    """What is wrong with a stack's ``bucketArea``, each naming the fix."""
    if area is None or (isinstance(area, str) and AREA_RE.fullmatch(area)):
        return []
    return [
        Problem(
            AREA_KEY,
            "is STACK@XXXXXXXX (a stack name, '@', 8 hex digits), as gpu-train wrote it",
            f"put back the value gpu-train wrote (git log -p on the stack file), or remove {AREA_KEY}: "
            "the next `train` makes a new area (runs in the old one stay in the bucket)",
            str(area),
        )
    ]


def area_of(stack: str, area: str | None) -> str:
    """The folder a stack's runs are in under RUNS_FOLDER: its ``bucketArea``, else (a stack from before areas,
    2026-11-28) its name, an area every stack of that name on that prefix shares."""
    return area or stack


def stack_prefix(place: BucketPlace, area: str) -> str:
    """The object prefix of one stack's runs: PREFIX/.gpu-train-runs/AREA/ (``area_of``). Until 2026-11-28 AREA
    was always the stack's name; until 2026-11 this was PREFIX/STACK/, which a stack on gs://B shared with every
    stack on gs://B/STACK: see docs/bucket.md for runs left there."""
    return f"{place.prefix}{RUNS_FOLDER}{area}/"


def run_prefix(place: BucketPlace, area: str, run: str, node: int = 0) -> str:
    """The object prefix of one run's files (node N > 0 of a cluster: its own folder inside)."""
    return f"{stack_prefix(place, area)}{run}/" + (f"node-{node}/" if node else "")


def parts_prefix(place: BucketPlace, area: str, run: str, node: int = 0) -> str:
    """Where the host's uploader keeps a big file's parts until it composes them into the run's object:
    beside the stacks' runs (PREFIX/.gpu-train-parts/AREA/RUN/), so no listing of a run ever sees one."""
    return f"{place.prefix}{PARTS_FOLDER}{area}/{run}/" + (f"node-{node}/" if node else "")


DATA_FOLDER = ".gpu-train-data/"  # starts with '.': no stack can have the name (STACK_NAME_PATTERN)


def data_prefix(place: BucketPlace, project: str | None) -> str:
    """Where `push --to bucket` puts a project's data: PREFIX/.gpu-train-data/PROJECT_ID/ (the project's id:
    gpu_train/identity.py), beside the stacks' runs under a name no stack can have (a stack named `data`
    once shared PREFIX/data/); a run copies exactly what the laptop's manifest names (bucketdoc.DataManifest)
    to its $DATA_DIR."""
    return f"{place.prefix}{DATA_FOLDER}{project or 'default'}/"


def _cel(text: str) -> str:
    """``text`` as a CEL string literal (IAM conditions' language)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def grant_conditions(place: BucketPlace, area: str) -> tuple[str, str]:
    """The IAM conditions of a stack VM's two grants on a shared bucket (Cloud Storage's resource names:
    ``projects/_/buckets/B`` for a listing, ``.../objects/NAME`` for an object): read, write and delete
    only under its own area's prefix and its parts' (and list only those prefixes, through the listing's
    ``objectListPrefix``); read the pushed data (never write it). Another stack's VM in a team bucket, of
    this stack's name too, can then neither read, overwrite nor delete this stack's runs, nor plant data a
    run copies."""
    bucket = f"projects/_/buckets/{place.name}"
    own = (stack_prefix(place, area), f"{place.prefix}{PARTS_FOLDER}{area}/")
    objects = " || ".join(f"resource.name.startsWith({_cel(f'{bucket}/objects/{p}')})" for p in own)
    listing = " || ".join(f"api.getAttribute('storage.googleapis.com/objectListPrefix', '').startsWith({_cel(p)})" for p in own)
    write = f"{objects} || (resource.name == {_cel(bucket)} && ({listing}))"
    read = f"resource.name.startsWith({_cel(f'{bucket}/objects/{place.prefix}{DATA_FOLDER}')})"
    return write, read
