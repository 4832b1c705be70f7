"""Importing AI Platform and Vertex AI jobs: the seeds' own examples and every legacy machine type,
the stack each produces, and that the stack passes `scripts/plan` (with a project and SSH ranges).
The import task run as a process: tests/unit/test_import_task.py."""

from __future__ import annotations

import pytest
import yaml

from gpu_train.catalog.loader import load_catalog
from gpu_train.importing import gcloud_flags, importer, translate
from gpu_train.importing.importer import CHANGED, EXACT, NOT_MAPPED, JobImportError
from infra.ops import plan

CATALOG = load_catalog()
TABLES = importer.load_tables()
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests user@host"

# AI Platform's GPU guide: a cluster of Compute Engine types with accelerators ...
GUIDE_CE = """
trainingInput:
  scaleTier: CUSTOM
  masterType: n1-highcpu-16
  masterConfig:
    acceleratorConfig:
      count: 4
      type: NVIDIA_TESLA_T4
  workerCount: 9
  workerType: n1-highcpu-16
  workerConfig:
    acceleratorConfig:
      count: 4
      type: NVIDIA_TESLA_T4
  parameterServerCount: 3
  parameterServerType: n1-highmem-8
"""
# ... and the same cluster in legacy machine types.
GUIDE_LEGACY = """
trainingInput:
  scaleTier: CUSTOM
  masterType: complex_model_m_gpu
  workerCount: 9
  workerType: complex_model_m_gpu
  parameterServerCount: 3
  parameterServerType: large_model
"""
GUIDE_GCLOUD = r"""gcloud ai-platform jobs submit training my_job \
  --package-path trainer/ --module-name trainer.task --job-dir gs://my-bucket/out --region us-central1 \
  --scale-tier custom --master-machine-type n1-highcpu-16 --master-accelerator count=4,type=nvidia-tesla-t4 \
  --worker-count 9 --worker-machine-type n1-highcpu-16 --worker-accelerator count=4,type=nvidia-tesla-t4 \
  --parameter-server-count 3 --parameter-server-machine-type n1-highmem-8 -- --epochs 10 --lr 0.1"""
VERTEX_H100 = """
displayName: h100-job
jobSpec:
  workerPoolSpecs:
    - machineSpec: {machineType: a3-highgpu-2g, acceleratorType: NVIDIA_H100_80GB, acceleratorCount: 2}
      replicaCount: 1
      diskSpec: {bootDiskType: pd-ssd, bootDiskSizeGb: 250}
      pythonPackageSpec:
        executorImageUri: us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-1.py310:latest
        packageUris: [gs://b/trainer-0.1.tar.gz]
        pythonModule: trainer.task
        args: [--epochs, "5"]
        env: [{name: WANDB_MODE, value: offline}]
  baseOutputDirectory: {outputUriPrefix: gs://b/vertex-out}
  scheduling: {timeout: 7200s}
"""
BASIC_GPU = "trainingInput: {scaleTier: BASIC_GPU, region: europe-west4, pythonModule: trainer.task}"


def run(text: str, **kw) -> translate.Translation:
    doc = yaml.safe_load(text)
    job = importer.read_any(doc, TABLES) if isinstance(doc, dict) else None
    return translate.translate(job, "imported", CATALOG, TABLES, **kw)


def gcloud(text: str, **kw) -> translate.Translation:
    job = gcloud_flags.read_gcloud_args(gcloud_flags.split_gcloud_command(text), TABLES)
    return translate.translate(job, "imported", CATALOG, TABLES, **kw)


def plans(settings: dict) -> tuple[str, int]:
    """scripts/plan on the imported stack, once the user gave a project, SSH ranges and a key."""
    raw = {**settings, "gcp:project": "proj-1", "gpu-train:sshSourceRanges": ["203.0.113.7/32"], "gpu-train:sshPublicKey": KEY}
    return plan.plan(raw, "imported")


T4x4 = {"machineType": "n1-highcpu-16", "gpuType": "nvidia-tesla-t4", "gpuCount": 4}
CLUSTER_POOLS = [
    {"role": "chief", **T4x4},
    {"role": "worker", "count": 9, **T4x4},
    {"role": "ps", "count": 3, "machineType": "n1-highmem-8"},
]


@pytest.mark.parametrize(
    "text, form, zone, shape, train_tail",
    [
        (GUIDE_CE, "yaml", "us-central1-a", {"pools": CLUSTER_POOLS}, ["--script", "YOUR_SCRIPT.py"]),
        (
            GUIDE_LEGACY,
            "yaml",
            "us-central1-a",
            {
                "pools": [
                    {"role": "chief", "machineType": "n1-standard-16", "gpuType": "nvidia-tesla-t4", "gpuCount": 4},
                    {"role": "worker", "count": 9, "machineType": "n1-standard-16", "gpuType": "nvidia-tesla-t4", "gpuCount": 4},
                    {"role": "ps", "count": 3, "machineType": "n1-highmem-8"},
                ]
            },
            ["--script", "YOUR_SCRIPT.py"],
        ),
        (
            GUIDE_GCLOUD,
            "gcloud",
            "us-central1-a",
            {"pools": CLUSTER_POOLS},
            ["--dir", ".", "--command", 'python -m trainer.task --epochs 10 --lr 0.1 --job-dir "$JOB_DIR"'],
        ),
        (
            VERTEX_H100,
            "yaml",
            "us-central1-a",
            {"machineType": "a3-highgpu-2g", "maxRunHours": 2, "bootDiskSizeGb": 250},
            # Vertex gives the code AIP_MODEL_DIR and its siblings, never a --job-dir its parser may reject; the
            # module runs in the prebuilt image it named (executorImageUri).
            [
                "--image",
                "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-1.py310:latest",
                "--command",
                'AIP_MODEL_DIR="$JOB_DIR/model/" AIP_CHECKPOINT_DIR="$JOB_DIR/checkpoints/" '
                'AIP_TENSORBOARD_LOG_DIR="$JOB_DIR/logs/" python -m trainer.task --epochs 5',
                "--env",
                "WANDB_MODE=offline",
            ],
        ),
        (
            BASIC_GPU,
            "yaml",
            "europe-west4-a",
            {"machineType": "n1-standard-8", "gpuType": "nvidia-tesla-t4", "gpuCount": 1},
            ["--command", "python -m trainer.task"],
        ),
        # No module named, a jobDir: the script the user names gets --job-dir, as AI Platform gave it.
        (
            "trainingInput: {scaleTier: BASIC_GPU, region: europe-west4, jobDir: gs://b/out}",
            "yaml",
            "europe-west4-a",
            {},
            ["--script", "YOUR_SCRIPT.py", "--pass-job-dir"],
        ),
    ],
)
def test_seed_examples(text, form, zone, shape, train_tail):
    t = gcloud(text) if form == "gcloud" else run(text)
    settings = {k.removeprefix("gpu-train:"): v for k, v in t.settings.items()}
    assert settings["zone"] == zone
    for key, value in shape.items():
        assert settings[key] == value, key
    assert t.train[:4] == ["gpu-train", "train", "--stack", "imported"]
    assert t.train[4:] == train_tail
    text_out, code = plans(t.settings)
    assert code == 0, text_out
    # Every field is accounted for, and what no job holds is named as a thing to do.
    assert {n.field for n in t.notes if n.status == NOT_MAPPED} >= {"gcp:project", "sshSourceRanges"}


def test_the_report_explains_each_change():
    legacy = run(GUIDE_LEGACY)
    k80 = [n for n in legacy.notes if n.status == CHANGED and "nvidia-tesla-k80" in n.detail]
    assert len(k80) == 2 and all("end of support" in n.detail for n in k80)
    vertex = run(VERTEX_H100)
    statuses = {n.field: n.status for n in vertex.notes}
    assert statuses["pythonPackageSpec.executorImageUri"] == CHANGED
    assert statuses["maxRunningTime"] == EXACT  # 7200 s is exactly 2 h
    output = next(n.detail for n in vertex.notes if n.field == "baseOutputDirectory")
    assert "gs://b/vertex-out" in output and "AIP_MODEL_DIR" in output
    assert any(n.field.startswith("workerPoolSpecs[0]") and "a3-highgpu-2g with its 2 x nvidia-h100-80gb" in n.detail for n in vertex.notes)


LEGACY = TABLES["legacyMachineTypes"]["types"]


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_every_legacy_machine_type(name):
    t = run(f"trainingInput: {{scaleTier: CUSTOM, masterType: {name}, region: us-central1}}")
    row = LEGACY[name]
    settings = {k.removeprefix("gpu-train:"): v for k, v in t.settings.items()}
    assert settings["machineType"] == row["machineType"]
    if row.get("gpuType") == "nvidia-tesla-k80":
        assert settings["gpuType"] == "nvidia-tesla-t4"
        assert settings["gpuCount"] == min(row["gpuCount"], 4)  # T4 attaches 1, 2 or 4
    elif row.get("gpuType") == "nvidia-tesla-p100":  # shut down 2026-09-15: the nearest current GPU
        assert (settings["gpuType"], settings["gpuCount"]) == ("nvidia-tesla-v100", row["gpuCount"])
        assert any(n.status == CHANGED and "2026-09-15" in n.detail and "nvidia-tesla-v100" in n.detail for n in t.notes)
    elif row.get("gpuType"):
        assert (settings["gpuType"], settings["gpuCount"]) == (row["gpuType"], row["gpuCount"])
    else:  # a CPU master: the chief carries a GPU, and the report says so
        assert settings["gpuType"] == "nvidia-tesla-t4"
        assert any(n.status == CHANGED and "had no GPU" in n.detail for n in t.notes)
    text, code = plans(t.settings)
    assert code == 0, text


@pytest.mark.parametrize("tier, nodes, ps", [("BASIC", None, 0), ("STANDARD_1", 8, 3), ("PREMIUM_1", 31, 11)])
def test_scale_tiers(tier, nodes, ps):
    t = run(f"trainingInput: {{scaleTier: {tier}, region: us-central1, pythonModule: m.task}}")
    pools = t.settings.get("gpu-train:pools")
    total = sum(p.get("count", 1) for p in pools) if pools else t.settings.get("gpu-train:nodes")
    assert total == nodes
    if ps:  # the parameter servers stay CPU only, the chief and workers get a GPU: pools
        assert pools[-1] == {"role": "ps", "count": ps, "machineType": "n1-standard-4"}
    assert plans(t.settings)[1] == 0
    assert "--ps" not in t.train  # the pools say which nodes are parameter servers
    if tier != "BASIC":
        assert any(n.field == "scaleTier" and n.status == CHANGED and "never published" in n.detail for n in t.notes)


@pytest.mark.parametrize(
    "text, message",
    [
        ("trainingInput: {scaleTier: BASIC_TPU}", "Cloud TPU"),
        ("trainingInput: {scaleTier: CUSTOM}", "needs masterType"),
        ("trainingInput: {scaleTier: CUSTOM, masterType: turbo}", "neither a Compute Engine machine type"),
        ("trainingInput: {scaleTier: CUSTOM, masterType: n1-standard-8, masterConfig: {acceleratorConfig: {type: TPU_V3}}}", "Cloud TPU"),
        ("trainingInput: {scaleTier: CUSTOM, masterType: standard, workerCount: 2}", "needs workerType"),
        ("trainingInput: {scaleTier: CUSTOM, masterType: standard, scheduling: {maxRunningTime: soon}}", "duration"),
        ("jobSpec: {workerPoolSpecs: [{replicaCount: 1}]}", "machineType is required"),
        ("- not a mapping", "expected a YAML mapping"),
    ],
)
def test_bad_jobs_say_what_is_wrong(text, message):
    with pytest.raises(JobImportError, match=message):
        doc = yaml.safe_load(text)
        translate.translate(importer.read_any(doc, TABLES), "x", CATALOG, TABLES)


def test_gcloud_flags_and_config_file_together():
    files = {"c.yaml": {"trainingInput": {"scaleTier": "CUSTOM", "masterType": "standard_v100", "region": "us-west1"}}}
    job = gcloud_flags.read_gcloud_args(
        ["--config", "c.yaml", "--module-name", "t.task", "--stream-logs", "--use-chief-in-tf-config", "--", "--x", "1"],
        TABLES,
        files.__getitem__,
    )
    t = translate.translate(job, "s", CATALOG, TABLES, project="p", ssh_ranges=("198.51.100.0/24",))
    assert t.settings["gcp:project"] == "p" and t.settings["gpu-train:sshSourceRanges"] == ["198.51.100.0/24"]
    assert t.settings["gpu-train:zone"].startswith("us-west1-")
    assert t.train[-2:] == ["--command", "python -m t.task --x 1"]
    assert any(n.field == "--stream-logs" and n.status == NOT_MAPPED for n in t.notes)
    assert not any(n.field in ("gcp:project", "sshSourceRanges") for n in t.notes)


def test_region_without_every_shape_moves_to_the_nearest_that_has_them():
    t = run(
        "trainingInput: {scaleTier: CUSTOM, masterType: n1-standard-8, masterConfig: {acceleratorConfig: "
        "{type: NVIDIA_TESLA_V100, count: 1}}, region: europe-west1}"
    )
    zone = t.settings["gpu-train:zone"]
    assert zone in CATALOG.zones_for("nvidia-tesla-v100") and not zone.startswith("europe-west1-")
    assert zone.startswith("europe-")  # same geography first
    assert any(n.field == "region" and n.status == CHANGED for n in t.notes)


def test_one_shape_cluster_gets_nodes_and_ps() -> None:
    t = run(
        "trainingInput: {scaleTier: CUSTOM, masterType: standard_v100, workerType: standard_v100, workerCount: 2,"
        " parameterServerType: standard_v100, parameterServerCount: 1, region: us-central1, pythonModule: a.b}"
    )
    assert t.settings["gpu-train:nodes"] == 4 and "gpu-train:pools" not in t.settings
    assert t.train[-2:] == ["--ps", "1"]


# gcloud's reference (`gcloud ai custom-jobs create --config`) writes one pool as a mapping, not a list of one.
VERTEX_SINGLE = """
workerPoolSpecs:
  machineSpec:
    machineType: n1-standard-8
    acceleratorType: NVIDIA_TESLA_T4
    acceleratorCount: 1
  replicaCount: 1
  pythonPackageSpec:
    executorImageUri: us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-1.py310:latest
    pythonModule: trainer.task
    args: [--epochs, "2"]
"""


@pytest.mark.parametrize("form", ["mapping", "list"])
def test_vertex_pool_as_a_single_mapping_is_the_list_of_one(form):
    doc = yaml.safe_load(VERTEX_SINGLE)
    if form == "list":
        doc["workerPoolSpecs"] = [doc["workerPoolSpecs"]]
    t = translate.translate(importer.read_any(doc, TABLES), "v", CATALOG, TABLES)
    assert {k: t.settings[f"gpu-train:{k}"] for k in ("machineType", "gpuType", "gpuCount")} == {
        "machineType": "n1-standard-8",
        "gpuType": "nvidia-tesla-t4",
        "gpuCount": 1,
    }
    assert "gpu-train:nodes" not in t.settings and t.train[-1].startswith("python -m trainer.task --epochs 2")
    assert (form == "mapping") == any(n.field == "workerPoolSpecs" and "mapping" in n.detail for n in t.notes)
    assert plans(t.settings)[1] == 0


@pytest.mark.parametrize(
    "text, problems",
    [
        (
            "trainingInput: {scaleTier: CUSTOM, workerCount: 2, parameterServerCount: 1, args: x}",
            [
                "needs masterType",
                "workerCount = 2 needs workerType",
                "parameterServerCount = 1 needs parameterServerType",
                "args must be a list",
            ],
        ),
        (
            "trainingInput: {scaleTier: CUSTOM, masterType: standard, workerCount: many, scheduling: {maxRunningTime: soon}}",
            ["workerCount = 'many'", "duration"],
        ),
        (
            "trainingInput: {scaleTier: CUSTOM, masterType: turbo, workerCount: 1, workerType: warp}",
            ["masterType = 'turbo'", "workerType = 'warp'"],
        ),
        (
            "workerPoolSpecs: [{replicaCount: 1}, {replicaCount: 2, machineSpec: {}}, {machineSpec: {machineType: n1-highmem-8},"
            " replicaCount: x}]",
            ["workerPoolSpecs[0].machineSpec.machineType", "workerPoolSpecs[1].machineSpec.machineType", "workerPoolSpecs[2].replicaCount"],
        ),
    ],
)
def test_every_missing_field_is_reported_at_once(text, problems):
    with pytest.raises(JobImportError) as e:
        translate.translate(importer.read_any(yaml.safe_load(text), TABLES), "x", CATALOG, TABLES)
    message = str(e.value)
    assert f"{len(problems)} problems in the job" in message, message
    for p in problems:
        assert p in message, (p, message)


@pytest.mark.parametrize(
    ("machine", "timeout", "expected", "words"),
    [
        ("a3-highgpu-2g", "7200s", {"flexStart": True, "maxRunHours": 2}, "FLEX_START -> gpu-train:flexStart true"),
        ("a3-highgpu-2g", None, {"flexStart": True, "maxRunHours": 168}, "Vertex's default timeout"),
        ("a3-highgpu-2g", "1000000s", {"flexStart": True, "maxRunHours": 168}, "1000000 s -> maxRunHours 168"),
        ("a3-highgpu-2g", "5400s", {"flexStart": True, "maxRunHours": 1.5}, "5400 s -> maxRunHours 1.5"),
        ("g2-standard-8", "3600s", {"flexStart": True, "maxRunHours": 1}, "FLEX_START"),
    ],
)
def test_a_vertex_flex_start_job_becomes_a_flex_start_stack(machine, timeout, expected, words):
    sched = f"{{strategy: FLEX_START, maxWaitDuration: 1800s{', timeout: ' + timeout if timeout else ''}}}"
    t = run(
        VERTEX_H100.replace("a3-highgpu-2g", machine)
        .replace(
            "acceleratorType: NVIDIA_H100_80GB, acceleratorCount: 2",
            "acceleratorCount: 0" if machine.startswith("g2") else "acceleratorType: NVIDIA_H100_80GB, acceleratorCount: 2",
        )
        .replace("scheduling: {timeout: 7200s}", f"scheduling: {sched}")
    )
    settings = {k.removeprefix("gpu-train:"): v for k, v in t.settings.items()}
    assert {k: settings.get(k) for k in expected} == expected and "spot" not in settings
    assert any(words in n.detail for n in t.notes), [n.detail for n in t.notes]
    assert any(n.field == "scheduling.maxWaitDuration" and n.status == CHANGED for n in t.notes)
    text_out, code = plans(t.settings)
    assert code == 0, text_out


def test_a_vertex_flex_start_job_on_n1_runs_on_demand():
    t = run(
        VERTEX_H100.replace(
            "machineType: a3-highgpu-2g, acceleratorType: NVIDIA_H100_80GB, acceleratorCount: 2",
            "machineType: n1-standard-8, acceleratorType: NVIDIA_TESLA_V100, acceleratorCount: 1",
        ).replace("scheduling: {timeout: 7200s}", "scheduling: {strategy: FLEX_START, timeout: 7200s}")
    )
    assert "gpu-train:flexStart" not in t.settings and t.settings["gpu-train:maxRunHours"] == 2
    assert any("n1-standard-8 cannot be had as Flex-start" in n.detail for n in t.notes)
