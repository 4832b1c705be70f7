"""The bucket's documents (gpu-train:bucket), part of the contract (gpu_train/contract.py re-exports them).

What the host's uploader records as verified in the bucket (runs/RUN/bucket.json), what `status` shows of
it, what `check` finds on an SSH host, and what `push --to bucket` recorded on the laptop (the manifest a
run copies exactly). Standard library only, Python 3.8+: the agent's zipapp carries it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from typing import NotRequired

# gpu-train:bucket: the host's uploader keeps what it verified in the bucket in runs/RUN/bucket.json
# (BucketRecord); `status` compares it with JOB_DIR to say what is still only on the host.
BUCKET_RECORD = "bucket.json"
UPLOAD_LOG = "upload.log"


class BucketFile(TypedDict):
    size: int
    mtimeNs: int
    crc32c: str  # base64 of the big-endian CRC32C, as Cloud Storage reports it
    generation: int


class BucketRecord(TypedDict, total=False):
    bucket: str
    prefix: str
    files: dict[str, BucketFile]  # path relative to JOB_DIR -> what is verified in the bucket
    final: bool  # the last pass after the job's end is done
    error: str | None
    at: float


class DataFile(TypedDict):
    """One file `push --to bucket` sent: the object's generation (the bucket chooses it, no writer can),
    its size and the SHA-256 of the bytes the laptop sent (a CRC32C a writer who chooses the bytes can match)."""

    generation: int
    size: int
    sha256: str


class DataManifest(TypedDict):
    """A pushed folder (its path in the project, e.g. ``data``) and its files (path inside it -> DataFile):
    written by the laptop at `push --to bucket`, carried in the spec. The host downloads exactly these
    generations, verifies each, and links only ``folder`` into the working directory: no manifest, no pull."""

    folder: str
    files: dict[str, DataFile]


class BucketView(TypedDict):
    """A run's bucket in `status`: where, what is verified there, what is only on the host."""

    url: str
    files: int
    bytes: int
    onlyHost: list[str]  # JOB_DIR files not (or not as they are now) in the bucket
    final: bool
    error: str | None


class BucketProbe(TypedDict):
    """`check`'s `bucket-check` on an SSH host (the uploader's Python and login environment): an answer of
    the agent's (gpu_train/answers.py ANSWERS), built and read through the codec."""

    python: str
    ok: bool  # credentials found; an object written, read back and deleted
    step: NotRequired[str]  # where it stopped: client, credentials, bucket, access, network
    detail: NotRequired[str]
    credentials: NotRequired[str]  # which ones the client found, or why none were needed
    member: NotRequired[str]  # the IAM member they act as (serviceAccount:EMAIL), where known
    object: NotRequired[str]


# Google's variables choosing a host's credentials (or the tests' emulator): a run's unit gets the login's too.
GOOGLE_ENV = ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "STORAGE_EMULATOR_HOST")
