"""The VM's read access to the Artifact Registry repository of the stack's image (gpu-train:image).

roles/artifactregistry.reader for the VM's own service account on that repository only (not the
project: gpu_train/gcp/artifacts.py says why); the VM pulls with its token from the metadata server
(gpu_train/data/containers.sh.in at boot, agent/registry.py at a run's start). An image in another
registry gets nothing here: its token is the user's secret, given to a run with --env-file.
"""

from __future__ import annotations

import pulumi

from gpu_train.gcp import artifacts
from gpu_train.stack.settings import StackConfig
from infra.gcpparts import gcp


def declare(name: str, cfg: StackConfig, account_email: pulumi.Output[str], parent: pulumi.Resource) -> list[pulumi.Resource]:
    repo = artifacts.repository(cfg.image)
    if repo is None:
        return []
    return [
        gcp.artifactregistry.RepositoryIamMember(
            f"{name}-image-reader",
            project=repo.project,
            location=repo.location,
            repository=repo.repository,
            role=artifacts.READER_ROLE,
            member=account_email.apply(lambda email: f"serviceAccount:{email}"),
            opts=pulumi.ResourceOptions(parent=parent),
        )
    ]
