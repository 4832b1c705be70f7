"""The e2e tier of tests/unit/test_jobs_sync_target.py (the same subject; its helpers are there)."""

from __future__ import annotations

import re

import pytest

from gpu_train import jobs


@pytest.mark.parametrize(
    ("pair", "environ", "words"),
    [
        ("1A=2", {}, "NAME=VALUE"),
        ("A-B", {"A-B": "x"}, "NAME=VALUE, or NAME"),
        ("JOB_DIR=/x", {}, "sets JOB_DIR"),
        ("GPU_TRAIN_RESUMES=3", {}, "sets GPU_TRAIN_RESUMES"),
        ("NOEQ", {}, "NOEQ is not set in this shell's environment; export it first"),
        ("TOKEN", {"TOKEN2": "x"}, "TOKEN is not set"),
    ],
)
def test_parse_env_rejects(pair: str, environ: dict, words: str) -> None:
    with pytest.raises(jobs.JobError, match=re.escape(words)):
        jobs.parse_env([pair], environ)
