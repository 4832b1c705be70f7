"""Before `scripts/up` creates anything: an existing bucket (gpu-train:bucket without bucketCreate) must
have uniform bucket-level access.

The VM's grants on the bucket are conditioned to its own stack's prefix (gpu_train.stack.bucket.
grant_conditions), and Cloud Storage takes IAM conditions only on a bucket with uniform bucket-level
access; without it, object ACLs could still give a VM (or anyone) what the conditions withhold. So such a
bucket is refused, naming the command that turns it on. Read with Google's client (buckets.get), which
honours STORAGE_EMULATOR_HOST: the tests use the real emulator.
"""

from __future__ import annotations

from typing import Any

from gpu_train.stack.bucket import parse_bucket
from gpu_train.stack.settings import StackConfig


def uniform_access_problem(doc: dict[str, Any], name: str) -> str | None:
    """What is wrong with bucket ``name`` as buckets.get describes it (``iamConfiguration``), or None."""
    enabled = ((doc.get("iamConfiguration") or {}).get("uniformBucketLevelAccess") or {}).get("enabled")
    if enabled is True:
        return None
    return (
        f"gpu-train:bucket gs://{name} does not have uniform bucket-level access: the VM's grant is limited to "
        f"its own stack's prefix by an IAM condition, which Cloud Storage takes only with it (object ACLs would "
        f"bypass it).\nfix: gcloud storage buckets update gs://{name} --uniform-bucket-level-access "
        f"(check first that nothing relies on the bucket's object ACLs), or gpu-train:bucketCreate for a new bucket"
    )


def bucket_problem(cfg: StackConfig) -> str | None:
    """The stack's existing bucket read through the Storage API and judged; None when there is nothing to check."""
    if not cfg.is_gcp or not cfg.bucket or cfg.bucket_create:
        return None
    name = parse_bucket(cfg.bucket).name
    try:
        from google.cloud import storage

        bucket = storage.Client(project=cfg.project).get_bucket(name)
    except Exception as e:  # credentials, no such bucket, no access: said, and nothing is created
        fix = "check the name, or `gcloud auth application-default login`"
        return f"cannot read gpu-train:bucket gs://{name}: {type(e).__name__}: {e}\nfix: {fix}"
    return uniform_access_problem(bucket._properties, name)
