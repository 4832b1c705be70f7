"""Artifact Registry's side of gpu-train:image: which repository an image is in, for the VM's read grant.

A Docker repository's images are named LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE[:TAG|@DIGEST]
(cloud.google.com/artifact-registry/docs/docker/names). The VM's service account is granted
roles/artifactregistry.reader on each such repository the stack names, never on the project: a project
grant would open every repository, other teams' too. Pure.
"""

from __future__ import annotations

import re
from typing import NamedTuple

READER_ROLE = "roles/artifactregistry.reader"
# A pull with the VM's token needs one of these scopes on the VM besides the grant: read-only storage suffices.
PULL_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
NAME_RE = re.compile(r"(?P<location>[a-z0-9-]+)-docker\.pkg\.dev/(?P<project>[a-z0-9.:-]+)/(?P<repository>[a-z0-9._-]+)/.+")


class Repository(NamedTuple):
    location: str
    project: str
    repository: str


def repository(image: str | None) -> Repository | None:
    """The Artifact Registry repository ``image`` is in, or None (another registry, or no image)."""
    m = NAME_RE.fullmatch(image or "")
    return Repository(m["location"], m["project"], m["repository"]) if m else None
