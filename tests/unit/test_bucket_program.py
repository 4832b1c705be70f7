"""gpu-train:bucket in the Pulumi program (under Pulumi's mocks) and in the stack's checks."""

from __future__ import annotations

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.stack import config
from gpu_train.stack.bucket import BucketPlace, parse_bucket, run_prefix
from infra import program
from infra.ops import preview
from tests.conftest import gcp_raw

CATALOG = load_catalog()
STORAGE = "https://www.googleapis.com/auth/devstorage.read_write"


def run(**overrides: object) -> preview.Preview:
    result = preview.run(program.main, stack="s", config=gcp_raw(**overrides))
    assert result.error is None, result.error
    return result


def vm_email(result: preview.Preview) -> str:
    (sa,) = [a for a in result.of_type("serviceaccount/account:Account") if a.name == "gpu-sa"]
    return f"serviceAccount:{sa.inputs['accountId']}@proj-1.iam.gserviceaccount.com"


def test_no_bucket_no_storage_access() -> None:
    result = run()
    assert not result.of_type("storage/bucket:Bucket") and not result.of_type("storage/bucketIAMMember:BucketIAMMember")
    (inst,) = result.of_type("compute/instance:Instance")
    assert STORAGE not in inst.inputs["serviceAccount"]["scopes"]


def test_an_existing_bucket_gets_the_vms_object_grant_on_it_only() -> None:
    result = run(bucket="gs://team-ckpt/exp/a")
    assert not result.of_type("storage/bucket:Bucket")  # not ours to create
    grants = {g.inputs["role"]: g.inputs for g in result.of_type("storage/bucketIAMMember:BucketIAMMember")}
    assert set(grants) == {"roles/storage.objectUser", "roles/storage.objectViewer"}
    for g in grants.values():
        assert (g["bucket"], g["member"]) == ("team-ckpt", vm_email(result))
    # nothing project-wide: the VM's project roles stay logs and metrics
    project_roles = {m.inputs["role"] for m in result.of_type("projects/iAMMember:IAMMember") if m.inputs["member"] == vm_email(result)}
    assert not any("storage" in r for r in project_roles)
    (inst,) = result.of_type("compute/instance:Instance")
    assert STORAGE in inst.inputs["serviceAccount"]["scopes"]
    assert not any("cloud-platform" in s for s in inst.inputs["serviceAccount"]["scopes"])


def test_the_vms_grants_are_its_own_stacks_prefix_and_the_data_read_only() -> None:
    """The grant was the whole bucket (objectUser, no condition): one VM could read, overwrite and delete
    every stack's runs and every project's data in a team bucket."""
    result = run(bucket="gs://team-ckpt/exp/a")
    grants = {g.inputs["role"]: g.inputs["condition"] for g in result.of_type("storage/bucketIAMMember:BucketIAMMember")}
    write, read = grants["roles/storage.objectUser"]["expression"], grants["roles/storage.objectViewer"]["expression"]
    objects = "projects/_/buckets/team-ckpt/objects/"
    assert f'resource.name.startsWith("{objects}exp/a/.gpu-train-runs/s/")' in write
    assert f'resource.name.startsWith("{objects}exp/a/.gpu-train-parts/s/")' in write
    assert "objectListPrefix', '').startsWith(\"exp/a/.gpu-train-runs/s/\")" in write  # listing: its own prefix only
    assert 'resource.name == "projects/_/buckets/team-ckpt"' in write
    assert write.count("startsWith") == 4 and "data" not in write
    assert read == f'resource.name.startsWith("{objects}exp/a/.gpu-train-data/")'


def condition_allows(expression: str, resource: str, list_prefix: str = "") -> bool:
    """The condition as IAM evaluates it, for these expressions (startsWith, ==, ||, &&, parentheses):
    CEL's literals are JSON strings here, so Python's own evaluation of the translated text agrees."""
    import re

    text = expression.replace("resource.name", repr(resource)).replace("||", " or ").replace("&&", " and ")
    text = re.sub(r"api\.getAttribute\('storage\.googleapis\.com/objectListPrefix', ''\)", repr(list_prefix), text)
    text = text.replace(".startsWith(", ".startswith(")
    return bool(eval(text, {"__builtins__": {}}))


@pytest.mark.parametrize(
    ("resource", "prefix", "write", "read"),
    [
        ("objects/exp/a/.gpu-train-runs/s/run_20260101_000000/ckpt.pt", "", True, False),
        ("objects/exp/a/.gpu-train-parts/s/run_20260101_000000/x.part0", "", True, False),
        ("objects/exp/a/.gpu-train-runs/s2/run_20260101_000000/ckpt.pt", "", False, False),  # another stack, a longer name
        ("objects/exp/a/.gpu-train-runs/other/run_20260101_000000/ckpt.pt", "", False, False),
        ("objects/exp/a/.gpu-train-data/proj/data/a.bin", "", False, True),
        ("", "exp/a/.gpu-train-runs/s/", True, False),  # listing its own runs
        ("", "exp/a/.gpu-train-runs/s/run_20260101_000000/", True, False),
        ("", "exp/a/", False, False),  # listing the whole prefix: every stack's runs
        ("", "exp/a/.gpu-train-runs/", False, False),
        ("", "exp/a/.gpu-train-runs/other/", False, False),
    ],
)
def test_what_the_conditions_let_a_vm_do(resource: str, prefix: str, write: bool, read: bool) -> None:
    from gpu_train.stack.bucket import grant_conditions

    full = "projects/_/buckets/team-ckpt" + (f"/{resource}" if resource else "")
    w, r = grant_conditions(parse_bucket("gs://team-ckpt/exp/a"), "s")
    assert (condition_allows(w, full, prefix), condition_allows(r, full, prefix)) == (write, read)


def test_an_existing_bucket_without_uniform_access_is_refused(gcs) -> None:
    """Against the real emulator's buckets.get: IAM conditions need uniform bucket-level access."""
    from infra.ops.bucketaccess import bucket_problem

    cfg = config.parse(gcp_raw(bucket="gs://ckpt/exp"), "s", CATALOG)
    why = bucket_problem(cfg)
    assert why is not None and "uniform bucket-level access" in why and "--uniform-bucket-level-access" in why
    bucket = gcs.client().bucket("ckpt")
    bucket.iam_configuration.uniform_bucket_level_access_enabled = True
    bucket.patch()
    assert bucket_problem(cfg) is None
    assert bucket_problem(config.parse(gcp_raw(bucket="gs://ckpt/exp", bucketCreate=True), "s", CATALOG)) is None  # ours to make
    missing = bucket_problem(config.parse(gcp_raw(bucket="gs://nosuch-bucket"), "s", CATALOG))
    assert missing is not None and "cannot read gpu-train:bucket gs://nosuch-bucket" in missing


def test_a_created_bucket_is_regional_uniform_private_and_outlives_destroy() -> None:
    result = run(bucket="team-ckpt-2", bucketCreate=True, zone="europe-west4-a", machineType="g2-standard-8", gpuType=None, gpuCount=None)
    (bucket,) = result.of_type("storage/bucket:Bucket")
    i = bucket.inputs
    assert (i["name"], i["location"], i["project"]) == ("team-ckpt-2", "EUROPE-WEST4", "proj-1")
    assert i["uniformBucketLevelAccess"] is True and i["publicAccessPrevention"] == "enforced"
    assert not i.get("forceDestroy") and bucket.retain_on_delete
    for grant in result.of_type("storage/bucketIAMMember:BucketIAMMember"):
        assert grant.inputs["bucket"] == "team-ckpt-2" and grant.inputs["member"] == vm_email(result)


@pytest.mark.parametrize(
    ("value", "place"),
    [
        ("ckpt", BucketPlace("ckpt", "")),
        ("gs://ckpt", BucketPlace("ckpt", "")),
        ("gs://ckpt/", BucketPlace("ckpt", "")),
        ("gs://my.ckpt/a//b/", BucketPlace("my.ckpt", "a/b/")),
    ],
)
def test_bucket_values(value: str, place: BucketPlace) -> None:
    assert parse_bucket(value) == place
    assert run_prefix(place, "l4", "train_20260101_000000") == f"{place.prefix}.gpu-train-runs/l4/train_20260101_000000/"
    assert run_prefix(place, "l4", "r", 2).endswith(".gpu-train-runs/l4/r/node-2/")


# A team bucket: stack `team` on gs://B beside stack `s2` on gs://B/team (and `s2`'s data, parts). The areas
# were PREFIX/STACK/: `team`'s grant (startsWith "team/") covered all of `s2`'s runs and its pushed data.
# And two stacks named `s2` on gs://B, each with its own area (bucketArea), beside a stack `s2` from before areas.
TEAM = [
    ("gs://team-ckpt", "team"),
    ("gs://team-ckpt/team", "s2"),
    ("gs://team-ckpt/team/s2", "s3"),
    ("gs://team-ckpt", "s2"),
    ("gs://team-ckpt", "s2@1a2b3c4d"),
    ("gs://team-ckpt", "s2@5e6f7a8b"),
]


@pytest.mark.parametrize(("mine", "theirs"), [(a, b) for a in TEAM for b in TEAM if a != b])
def test_no_stacks_grant_covers_anything_of_another_stack_in_the_bucket(mine: tuple, theirs: tuple) -> None:
    from gpu_train.stack.bucket import data_prefix, grant_conditions, parts_prefix

    other = parse_bucket(theirs[0])
    w, r = grant_conditions(parse_bucket(mine[0]), mine[1])
    bucket = "projects/_/buckets/team-ckpt"
    for name in (
        run_prefix(other, theirs[1], "run_20260101_000000") + "ckpt.pt",
        parts_prefix(other, theirs[1], "run_20260101_000000") + "ckpt.pt.part-00-of-02",
    ):
        assert not condition_allows(w, f"{bucket}/objects/{name}") and not condition_allows(r, f"{bucket}/objects/{name}")
    listing = run_prefix(other, theirs[1], "")[:-1]  # PREFIX/.gpu-train-runs/STACK/
    assert not condition_allows(w, bucket, listing) and not condition_allows(r, bucket, listing)
    if other.prefix != parse_bucket(mine[0]).prefix:  # the data of another prefix: not even read
        data = f"{bucket}/objects/{data_prefix(other, 'proj')}a.bin"
        assert not condition_allows(w, data) and not condition_allows(r, data)


@pytest.mark.parametrize("value", ["gs://ckpt/.gpu-train-runs", "gs://ckpt/x/.gpu-train-data/y", "gs://ckpt/.gpu-train"])
def test_a_prefix_cannot_take_gpu_trains_own_folders(value: str) -> None:
    """A prefix holding .gpu-train-runs would make its runs' area another prefix's: refused, naming why."""
    with pytest.raises(ValueError, match=r"cannot start with '\.gpu-train'"):
        parse_bucket(value)
    from gpu_train.stack.bucket import bucket_problems

    (problem,) = bucket_problems(value, False)
    assert str(problem).startswith("gpu-train:bucket") and "gpu-train's own folders" in str(problem)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"bucket": "Ckpt"}, "lowercase"),
        ({"bucket": "gs://ab"}, "3 to 63"),
        ({"bucket": "gs://google-ckpt"}, "google"),
        ({"bucket": "192.168.1.10"}, "IP address"),
        ({"bucket": "gs://ckpt/a/../b"}, "'..'"),
        ({"bucketCreate": True}, "needs gpu-train:bucket"),
    ],
)
def test_bad_bucket_settings_name_the_setting_and_the_fix(raw: dict, words: str) -> None:
    with pytest.raises(config.ConfigError) as e:
        config.parse(gcp_raw(**raw), "s", CATALOG)
    text = str(e.value)
    assert words in text and "fix: pulumi config set gpu-train:bucket" in text


def test_an_invalid_bucket_creates_nothing() -> None:
    result = preview.run(program.main, stack="s", config=gcp_raw(bucket="Bad_Bucket"))
    assert result.error is not None and "gpu-train:bucket" in str(result.error) and not result.resources


def test_ssh_stacks_may_name_a_bucket_but_not_create_one() -> None:
    raw = {"gpu-train:target": "ssh", "gpu-train:hosts": ["u@h:22"], "gpu-train:bucket": "gs://ckpt/x"}
    assert config.parse(raw, "s", CATALOG).bucket == "gs://ckpt/x"
    with pytest.raises(config.ConfigError, match="bucketCreate"):
        config.parse({**raw, "gpu-train:bucketCreate": True}, "s", CATALOG)
