"""The stack's Cloud Storage bucket (gpu-train:bucket): created or existing, and the VM's access to it.

With ``bucketCreate`` the program creates the bucket in the VM's region (no egress charge between
them), with uniform bucket-level access and public access prevented, and retains it when the stack
is destroyed: checkpoints in a bucket are what is meant to outlive the VM. Either way the VM's own
service account gets two conditioned grants on this bucket only (a team bucket is a shared room): object
read/write/delete under its own stack's area and its parts' (gpu_train.stack.bucket.grant_conditions),
and object read under the pushed data's prefix. IAM conditions need uniform bucket-level access: an
existing bucket without it is refused before anything is created (infra/ops/preflight.py).
"""

from __future__ import annotations

import pulumi

from gpu_train.gcp import vm
from gpu_train.stack.bucket import area_of, grant_conditions, parse_bucket
from gpu_train.stack.settings import StackConfig
from infra.gcpparts import gcp


def declare(
    name: str, cfg: StackConfig, account_email: pulumi.Output[str], labels: dict[str, str], parent: pulumi.Resource
) -> list[pulumi.Resource]:
    """The bucket (when the stack creates it) and the VM's grant on it; nothing without ``bucket``."""
    if not cfg.bucket:
        return []
    place = parse_bucket(cfg.bucket)
    made: list[pulumi.Resource] = []
    bucket_name: pulumi.Input[str] = place.name
    if cfg.bucket_create:
        created = gcp.storage.Bucket(
            f"{name}-bucket",
            name=place.name,
            project=cfg.project,
            location=cfg.region.upper(),
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            force_destroy=False,  # never deletes objects; retained below anyway
            labels=labels,
            # Soft delete (7 days by default on new buckets) bills every overwritten checkpoint and every
            # composed part for 7 more days; off unless gpu-train:bucketSoftDelete keeps it.
            soft_delete_policy=None if cfg.bucket_soft_delete else {"retention_duration_seconds": 0},
            # `down` (pulumi destroy) leaves the bucket and its runs; delete it yourself when done.
            opts=pulumi.ResourceOptions(parent=parent, retain_on_delete=True),
        )
        made.append(created)
        bucket_name = created.name
    write, read = grant_conditions(place, area_of(cfg.stack, cfg.bucket_area))
    member = account_email.apply(lambda email: f"serviceAccount:{email}")
    for suffix, role, title, expression in (
        ("objects", vm.BUCKET_ROLE, "own stack's runs", write),
        ("data", vm.BUCKET_DATA_ROLE, "pushed data, read only", read),
    ):
        made.append(
            gcp.storage.BucketIAMMember(
                f"{name}-bucket-{suffix}",
                bucket=bucket_name,
                role=role,
                member=member,
                condition=gcp.storage.BucketIAMMemberConditionArgs(title=f"gpu-train {cfg.stack}: {title}", expression=expression),
                opts=pulumi.ResourceOptions(parent=parent),
            )
        )
    return made
