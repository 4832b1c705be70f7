"""A new user's first tries, on a real sshd: Ctrl-C in the middle of `train`'s code sync, a
--script given from a subdirectory. This suite's loopback addresses are 127.0.25.x."""

from __future__ import annotations

import pytest

from remote import loopback
from tests.unit.test_project import GPU_TRAIN, Project, proj, sshd  # noqa: F401  (fixtures)


@pytest.mark.parametrize(("setenv", "name", "sets"), [
    ("HOME=/h", "HOME", True),
    ("OMP_NUM_THREADS=1 HOME=/h", "HOME", True),
    ("CUDA_HOME=/opt/cuda", "HOME", False),  # another variable that ends in HOME keeps the server's own HOME
    ("GPU_TRAIN_HOME=/x XDG_CONFIG_HOME=/y", "HOME", False),
    ("", "HOME", False),
    ("GPU_TRAIN_AUTHORIZED_KEYS=/k", "GPU_TRAIN_AUTHORIZED_KEYS", True),
])  # fmt: skip
def test_a_loopback_sshds_setenv_is_read_by_name(setenv: str, name: str, sets: bool) -> None:
    assert loopback.sets(setenv, name) is sets
