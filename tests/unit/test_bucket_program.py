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
    (grant,) = result.of_type("storage/bucketIAMMember:BucketIAMMember")
    assert grant.inputs == {"bucket": "team-ckpt", "role": "roles/storage.objectUser", "member": vm_email(result)}
    # nothing project-wide: the VM's project roles stay logs and metrics
    project_roles = {m.inputs["role"] for m in result.of_type("projects/iAMMember:IAMMember") if m.inputs["member"] == vm_email(result)}
    assert not any("storage" in r for r in project_roles)
    (inst,) = result.of_type("compute/instance:Instance")
    assert STORAGE in inst.inputs["serviceAccount"]["scopes"]
    assert not any("cloud-platform" in s for s in inst.inputs["serviceAccount"]["scopes"])


def test_a_created_bucket_is_regional_uniform_private_and_outlives_destroy() -> None:
    result = run(bucket="team-ckpt-2", bucketCreate=True, zone="europe-west4-a", machineType="g2-standard-8", gpuType=None, gpuCount=None)
    (bucket,) = result.of_type("storage/bucket:Bucket")
    i = bucket.inputs
    assert (i["name"], i["location"], i["project"]) == ("team-ckpt-2", "EUROPE-WEST4", "proj-1")
    assert i["uniformBucketLevelAccess"] is True and i["publicAccessPrevention"] == "enforced"
    assert not i.get("forceDestroy") and bucket.retain_on_delete
    (grant,) = result.of_type("storage/bucketIAMMember:BucketIAMMember")
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
    assert run_prefix(place, "l4", "train_20260101_000000") == f"{place.prefix}l4/train_20260101_000000/"
    assert run_prefix(place, "l4", "r", 2).endswith("l4/r/node-2/")


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
