"""A run in a container image, as the laptop and the host both read it: part of the contract
(gpu_train/contract.py names it in JobSpec), apart by concept. Standard library only, Python 3.8+: the
agent's zipapp carries it beside the contract."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_train.codec import Document


@dataclass(frozen=True)
class ContainerSpec(Document):
    """`train --image`: the job runs in a container of ``image`` (Docker, else rootless Podman).

    Without ``own_program`` the project's code runs inside it (``--script``/``--command``) with the code,
    JOB_DIR, DATA_DIR and the working directory mounted at the same paths. With it, the image's own
    program runs as Vertex AI runs a ``containerSpec``: ``entrypoint`` (Vertex's ``command``) replaces the
    image's ENTRYPOINT, ``args`` replace its CMD, and no code is sent."""

    image: str
    own_program: bool = False
    entrypoint: tuple[str, ...] = ()  # () keeps the image's ENTRYPOINT
    args: tuple[str, ...] = ()  # () keeps the image's CMD (unless entrypoint is given: Docker drops CMD then, as Vertex does)
    WHAT, REQUIRED = "the container spec", ("image",)


# An image reference as `train --image` and gpu-train:image take it (Docker's grammar, loosely: never an
# option, a path or a URL): [REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST].
IMAGE_REF_PATTERN = (
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?"  # the registry (or the first part of the name)
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"  # the name's other parts
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"  # tag, digest
)
# The container's name on its host: CONTAINER_PREFIX + run id + "-" + 8 hex digits of REMOTE_ROOT's hash.
CONTAINER_PREFIX = "gpu-train-"


@dataclass(frozen=True)
class PinnedImage:
    """A container run's image as its first start resolved it, run on every start (RunRecord's fields)."""

    image_id: str | None = None  # the image's ID (sha256:...)
    image_digest: str | None = None  # its registry digest (REPO@sha256:...), to pull that very image where it is gone
    engine: str | None = None  # docker or podman: chosen at launch, kept for every start
