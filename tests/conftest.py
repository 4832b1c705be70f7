"""Shared fixtures. The real sshd on loopback is remote/loopback.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "guest: boots a real systemd guest with systemd-nspawn (root); tests/guest/")


@pytest.fixture(scope="session")
def public_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway key pair; the path of its public half."""
    d = tmp_path_factory.mktemp("keys")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "id_ed25519")], check=True)
    return d / "id_ed25519.pub"


def gcp_raw(**overrides: object) -> dict[str, object]:
    """Raw settings of a valid GCP stack (1 x T4 on n1-standard-8), with overrides by bare key."""
    raw: dict[str, object] = {
        "gcp:project": "proj-1",
        "gpu-train:zone": "us-central1-a",
        "gpu-train:machineType": "n1-standard-8",
        "gpu-train:gpuType": "nvidia-tesla-t4",
        "gpu-train:gpuCount": 1,
        "gpu-train:sshSourceRanges": ["203.0.113.7/32"],
        "gpu-train:sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests user@host",
    }
    for k, v in overrides.items():
        key = k if ":" in k else f"gpu-train:{k}"
        if v is None:
            raw.pop(key, None)
        else:
            raw[key] = v
    return raw
