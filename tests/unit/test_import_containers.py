"""Imported container jobs (issue 40): Vertex's containerSpec, AI Platform's imageUri and container
command/args, a package in Google's prebuilt image, env values to a file, /gcs paths and pools named.
(tests/e2e/test_container_vertex.py runs imported ones end to end.)"""

from __future__ import annotations

import pytest
import yaml

from gpu_train.importing import importer, translate
from gpu_train.importing.importer import CHANGED, EXACT
from tests.unit.test_import import CATALOG, TABLES, run


def test_a_container_job_runs_its_image_as_vertex_did():
    t = run(
        "jobSpec: {workerPoolSpecs: [{machineSpec: {machineType: g2-standard-8}, replicaCount: 1, "
        "containerSpec: {imageUri: gcr.io/p/img, command: [python3, -m, trainer], args: [--data, /gcs/b/d], "
        "env: [{name: TOKEN, value: s3cret}]}}], baseOutputDirectory: {outputUriPrefix: gs://b/out}}"
    )
    assert t.train[t.train.index("--image") :] == [
        "--image", "gcr.io/p/img", "--entrypoint", "python3 -m trainer", "--args", "--data /gcs/b/d", "--env", "TOKEN=s3cret",
    ]  # fmt: skip
    assert t.env == {"TOKEN": "s3cret"}
    by = {n.field: n for n in t.notes}
    assert by["containerSpec.imageUri"].status == by["containerSpec.command"].status == by["containerSpec.args"].status == EXACT
    assert by["/gcs/ paths"].status == CHANGED and "$DATA_DIR" in by["/gcs/ paths"].detail
    assert "AIP_MODEL_DIR" in by["baseOutputDirectory"].detail


def test_container_env_goes_to_a_file_named_on_the_command_line():
    job = importer.read_any(
        yaml.safe_load(
            "workerPoolSpecs: [{machineSpec: {machineType: g2-standard-8}, "
            "containerSpec: {imageUri: i, env: [{name: K, value: s3cret-value}]}}]"
        ),
        TABLES,
    )
    t = translate.translate(job, "s", CATALOG, TABLES, env_file="/home/u/.gpu-train/imports/s.env")
    assert t.train[-2:] == ["--env-file", "/home/u/.gpu-train/imports/s.env"] and "s3cret-value" not in " ".join(t.train)


@pytest.mark.parametrize(
    ("yaml_text", "image", "flags"),
    [
        (  # AI Platform's custom container: args go to it
            "trainingInput: {scaleTier: CUSTOM, masterType: n1-standard-8, masterConfig: {imageUri: gcr.io/p/i:1, "
            "containerCommand: [run.sh]}, args: [--epochs, '3']}",
            "gcr.io/p/i:1",
            ["--entrypoint", "run.sh", "--args", "--epochs 3"],
        ),
        (  # a Python package in Google's prebuilt image: the module runs inside it, from the synced source
            "workerPoolSpecs: [{machineSpec: {machineType: g2-standard-8}, pythonPackageSpec: {executorImageUri: "
            "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-1.py310:latest, pythonModule: trainer.task}}]",
            "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-1.py310:latest",
            ["--command", "python -m trainer.task"],
        ),
    ],
)
def test_images_of_ai_platform_and_prebuilt_executors(yaml_text, image, flags):
    t = translate.translate(importer.read_any(yaml.safe_load(yaml_text), TABLES), "s", CATALOG, TABLES)
    assert t.train[t.train.index("--image") + 1] == image
    assert all(f in t.train for f in flags), t.train


TWO_IMAGES = """
workerPoolSpecs:
- machineSpec: {machineType: g2-standard-8}
  containerSpec: {imageUri: a, command: [run, chief], args: [--lr, '0.1'], env: [{name: K, value: chief-secret}]}
- machineSpec: {machineType: g2-standard-8}
  replicaCount: 2
  containerSpec: {imageUri: b, command: [run, worker], env: [{name: K, value: worker-secret}]}
- machineSpec: {machineType: n1-highmem-8}
  pythonPackageSpec: {executorImageUri: c, pythonModule: trainer.ps, args: [--x], env: [{name: P, value: ps-secret}]}
baseOutputDirectory: {outputUriPrefix: gs://b/out}
"""


def test_each_pool_runs_its_own_image_command_args_and_env():
    job = importer.read_any(yaml.safe_load(TWO_IMAGES), TABLES)
    t = translate.translate(job, "s", CATALOG, TABLES, env_file="/s/imports/s.env", pools_file="/s/imports/s.pools.yaml")
    assert t.pools == {
        "worker": {"image": "b", "entrypoint": ["run", "worker"], "env": {"K": "worker-secret"}},
        "ps": {
            "image": "c",
            "command": 'AIP_MODEL_DIR="$JOB_DIR/model/" AIP_CHECKPOINT_DIR="$JOB_DIR/checkpoints/" '
            'AIP_TENSORBOARD_LOG_DIR="$JOB_DIR/logs/" python -m trainer.ps --x',
            "env": {"P": "ps-secret"},
        },
    }
    assert t.train[-2:] == ["--pools", "/s/imports/s.pools.yaml"]
    assert t.train[t.train.index("--image") + 1] == "a" and t.env == {"K": "chief-secret"}
    assert "secret" not in " ".join(t.train)
    by = {n.field: n for n in t.notes}
    assert by["worker pool's container"].status == by["ps pool's container"].status == EXACT
    assert "worker-secret" not in by["worker pool's container"].detail
    from gpu_train import pooljobs  # what the import writes, train reads

    read = pooljobs.read_pools(yaml.safe_load(yaml.safe_dump(t.pools)), "f")
    assert read["worker"].container.entrypoint == ("run", "worker") and read["ps"].command == t.pools["ps"]["command"]


def test_pools_that_run_the_chiefs_container_need_no_pools_file():
    t = run(
        "workerPoolSpecs: [{machineSpec: {machineType: g2-standard-8}, containerSpec: {imageUri: a, args: [x]}}, "
        "{machineSpec: {machineType: g2-standard-8}, replicaCount: 2, containerSpec: {imageUri: a, args: [x]}}]"
    )
    assert "--pools" not in t.train and t.pools == {}


def test_ai_platforms_worker_image_runs_on_the_workers_with_the_jobs_args():
    from tests.unit.test_import import gcloud

    t = gcloud(
        "gcloud ai-platform jobs submit training j --region us-central1 --scale-tier custom "
        "--master-machine-type n1-standard-8 --master-accelerator count=1,type=nvidia-tesla-t4 --master-image-uri gcr.io/p/m:1 "
        "--worker-machine-type n1-standard-8 --worker-accelerator count=1,type=nvidia-tesla-t4 --worker-count 2 "
        "--worker-image-uri gcr.io/p/w:1 -- --epochs 3"
    )
    assert t.pools == {"worker": {"image": "gcr.io/p/w:1", "args": ["--epochs", "3"]}}  # AI Platform's args go to every replica
    assert t.train[t.train.index("--image") + 1] == "gcr.io/p/m:1" and "--pools" in t.train
