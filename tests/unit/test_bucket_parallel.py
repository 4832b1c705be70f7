"""A big file goes to the bucket in parts sent in parallel, composed into its object
(agent/composite.py): against a real storage emulator, and killed mid-way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import composite
from gpu_train.jobs import in_bucket
from gpu_train.stack.bucket import PARTS_FOLDER
from tests.unit.test_bucket_upload import RUN

PARTS = f"p/{PARTS_FOLDER}lab/{RUN}/"
BIG = composite.PARALLEL_FROM + (16 << 20)  # past the threshold: parts


@pytest.mark.parametrize(
    ("size", "want"),
    [
        (0, [(0, 0)]),
        (composite.PARALLEL_FROM - 1, [(0, composite.PARALLEL_FROM - 1)]),  # below the threshold: one stream
        (64 << 20, [(0, 32 << 20), (32 << 20, 32 << 20)]),
        (100 << 20, [(0, 34952534), (34952534, 34952534), (69905068, 34952532)]),  # 3 parts of at least PART_MIN
        (10 << 30, [(i * (320 << 20), 320 << 20) for i in range(32)]),  # never more than compose takes (32)
    ],
)
def test_a_file_is_cut_into_parts_above_the_threshold_never_more_than_compose_takes(size: int, want: list) -> None:
    assert composite.PARALLEL_FROM == 64 << 20 and composite.PART_MIN == 32 << 20
    got = composite.slices(size)
    assert got == want
    assert sum(length for _, length in got) == size and len(got) <= 32


def test_parts_go_beside_the_stacks_runs_and_never_past_cloud_storages_name_limit() -> None:
    from gpu_train.contract import JobSpec

    spec = in_bucket([JobSpec(run_id="r1", base="runs/r1", project="proj")], "lab", "gs://ckpt/team")[0]
    assert spec.bucket == {
        "name": "ckpt",
        "prefix": "team/.gpu-train-runs/lab/r1/",
        "data": "team/.gpu-train-data/proj/",
        "parts": "team/.gpu-train-parts/lab/r1/",
    }
    assert composite.part_names("team/.gpu-train-parts/lab/r1/", "ck/a.pt", 3) == [
        f"team/.gpu-train-parts/lab/r1/ck/a.pt.part-{i:02d}-of-03" for i in range(3)
    ]
    assert composite.part_names("p/", "x" * 1010, 2) is None  # the file goes as one stream


def record(d: Path) -> dict:
    return json.loads((d / "bucket.json").read_text())


def with_parts(d: Path) -> None:
    spec = json.loads((d / "spec.json").read_text())
    spec["bucket"]["parts"] = PARTS
    (d / "spec.json").write_text(json.dumps(spec))
