"""The recovery as the real Pulumi program declares it, under Pulumi's mock runtime: what exists, who may do what."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.bundle import parse_python
from gpu_train import recovery as decisions
from infra import program, recovery
from infra.ops import preview
from tests.conftest import gcp_raw

STDLIB = set(sys.stdlib_module_names)


def run(public_key: Path, **settings) -> preview.Preview:
    raw = gcp_raw(**settings)
    raw["gpu-train:sshPublicKey"] = str(public_key)
    result = preview.run(program.main, stack="s", config=raw)
    assert result.error is None, result.error
    return result


def preview_unique(email: str) -> str:
    """The service account's unique id as the mock engine answers it (Google: 21 digits, new for each account)."""
    import hashlib

    return str(int(hashlib.sha256(email.encode()).hexdigest()[:15], 16))


def test_a_custom_roles_id_is_new_with_each_service_account() -> None:
    first, again = recovery.role_id("s", "recover", "112233445566778899001"), recovery.role_id("s", "recover", "9988")
    assert first != again and first == "gpuTrain_s_recover_78899001"
    long = recovery.role_id("x" * 90, "operations", "112233445566778899001")
    assert len(long) <= 64 and long.replace("_", "").isalnum()


def one(result: preview.Preview, suffix: str) -> dict:
    (found,) = result.of_type(suffix)
    return found.inputs


def test_a_spot_stack_gets_its_way_back_with_the_least_privilege(public_key: Path) -> None:
    result = run(public_key, spot=True, nodes=2, recoverHours=6)
    names = ["gpu-train-s-0", "gpu-train-s-1"]
    fn = one(result, "cloudfunctionsv2/function:Function")
    sa = next(a.inputs for a in result.of_type("serviceaccount/account:Account") if a.name == "gpu-recovery-sa")
    email = f"{sa['accountId']}@proj-1.iam.gserviceaccount.com"
    member = f"serviceAccount:{email}"
    unique = preview_unique(email)
    # scale to zero, one at a time, retried with backoff; it runs and is triggered as its own account
    svc, trigger = fn["serviceConfig"], fn["eventTrigger"]
    assert (svc["minInstanceCount"], svc["maxInstanceCount"], svc["ingressSettings"]) == (0, 1, "ALLOW_INTERNAL_ONLY")
    assert svc["serviceAccountEmail"] == trigger["serviceAccountEmail"] == email
    assert svc["environmentVariables"] == {
        "GPU_TRAIN_STACK": "s",
        "GPU_TRAIN_NODES": ",".join(names),
        "GPU_TRAIN_RECOVER_HOURS": "6",
        "GPU_TRAIN_GCP_PROJECT": "proj-1",
        "GPU_TRAIN_ZONE": "us-central1-a",
    }
    assert trigger["retryPolicy"] == "RETRY_POLICY_RETRY"
    assert trigger["eventType"] == "google.cloud.pubsub.topic.v1.messagePublished"
    topic = one(result, "pubsub/topic:Topic")
    assert trigger["pubsubTopic"] == f"projects/proj-1/topics/{topic['name']}"
    assert fn["buildConfig"]["entryPoint"] == recovery.ENTRY_POINT
    # the sink: the two system events of these VMs only, into that topic, which only the sink may publish to
    sink = one(result, "logging/projectSink:ProjectSink")
    assert sink["destination"] == f"pubsub.googleapis.com/projects/proj-1/topics/{topic['name']}"
    assert sink["uniqueWriterIdentity"] is True
    f = sink["filter"]
    assert "cloudaudit.googleapis.com%2Fsystem_event" in f
    assert '"compute.instances.preempted" OR "compute.instances.hostError"' in f
    assert all(f'"projects/proj-1/zones/us-central1-a/instances/{n}"' in f for n in names)
    publish = one(result, "pubsub/topicIAMMember:TopicIAMMember")
    assert publish["role"] == "roles/pubsub.publisher"
    assert publish["member"].startswith("serviceAccount:service-") and "gcp-sa-logging" in publish["member"]
    # what the function's account may do: start (get, stop, setLabels: no actAs, no metadata) these instances, read operations
    roles = {r.inputs["roleId"]: r.inputs for r in result.of_type("IAMCustomRole")}
    start_role = roles[recovery.role_id("s", "recover", unique)]
    assert (
        sorted(start_role["permissions"])
        == sorted(recovery.INSTANCE_PERMISSIONS)
        == ["compute.instances.get", "compute.instances.setLabels", "compute.instances.start", "compute.instances.stop"]
    )
    assert roles[recovery.role_id("s", "operations", unique)]["permissions"] == ["compute.zoneOperations.get"]
    on_instances = [g.inputs for g in result.of_type("compute/instanceIAMMember:InstanceIAMMember") if g.inputs["member"] == member]
    assert sorted(g["instanceName"] for g in on_instances) == names
    assert {(g["role"], g["member"], g["zone"]) for g in on_instances} == {
        (f"projects/proj-1/roles/{recovery.role_id('s', 'recover', unique)}", member, "us-central1-a")
    }
    # each VM may read itself (the record is its labels, which the metadata server does not show), nothing more
    vm_sa = next(a.inputs for a in result.of_type("serviceaccount/account:Account") if a.name == "gpu-sa")
    vm_member = f"serviceAccount:{vm_sa['accountId']}@proj-1.iam.gserviceaccount.com"
    itself = [g.inputs for g in result.of_type("compute/instanceIAMMember:InstanceIAMMember") if g.inputs["member"] == vm_member]
    assert sorted(g["instanceName"] for g in itself) == names
    assert roles[recovery.role_id("s", "self", unique)]["permissions"] == ["compute.instances.get"]
    scopes = {s for i in result.of_type("compute/instance:Instance") for s in i.inputs["serviceAccount"]["scopes"]}
    assert "https://www.googleapis.com/auth/compute.readonly" in scopes
    project_grants = [g.inputs for g in result.of_type("projects/iAMMember:IAMMember") if g.inputs["member"] == member]
    assert [g["role"] for g in project_grants] == [f"projects/proj-1/roles/{recovery.role_id('s', 'operations', unique)}"]
    invoker = one(result, "cloudrunv2/serviceIamMember:ServiceIamMember")
    assert (invoker["role"], invoker["member"], invoker["name"]) == ("roles/run.invoker", member, fn["name"])
    every_grant = [r for r in result.resources if "IAM" in r.typ or "Iam" in r.typ]
    assert {r.inputs["member"] for r in every_grant if r.inputs.get("member") == member} == {member}
    assert len([r for r in every_grant if r.inputs.get("member") == member]) == 4  # two instances, operations, invoker
    # the VMs say they want to come back; the source bucket goes with the stack
    assert [i.inputs["labels"][decisions.LABEL] for i in result.of_type("compute/instance:Instance")] == ["on", "on"]
    assert one(result, "storage/bucket:Bucket")["forceDestroy"] is True
    assert result.outputs["recoverHours"] == 6


@pytest.mark.parametrize("settings", [{"spot": False}, {"spot": True, "recoverHours": 0}])
def test_no_recovery_where_nothing_is_preempted_or_it_is_off(public_key: Path, settings: dict) -> None:
    result = run(public_key, **settings)
    assert not [r for r in result.resources if "recovery" in r.name]
    labels = one(result, "compute/instance:Instance")["labels"]
    assert labels.get(decisions.LABEL) == ("off" if settings["spot"] else None)


def test_running_false_turns_the_vms_label_off(public_key: Path) -> None:
    result = run(public_key, spot=True, running=False)
    assert one(result, "compute/instance:Instance")["labels"][decisions.LABEL] == "off"


def test_the_webhook_is_a_secret_the_function_reads_and_no_output_shows(public_key: Path) -> None:
    url = "https://ntfy.sh/a-secret-topic-8d1f"
    result = run(public_key, spot=True, notify=url)
    version = one(result, "secretmanager/secretVersion:SecretVersion")
    assert version["secretData"] == {
        "4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270",
        "value": url,
    }  # a secret: Pulumi's signature of one, then its value
    fn = one(result, "cloudfunctionsv2/function:Function")
    (ref,) = fn["serviceConfig"]["secretEnvironmentVariables"]
    assert ref["key"] == "GPU_TRAIN_NOTIFY" and url not in json.dumps(fn)
    reader = one(result, "secretmanager/secretIamMember:SecretIamMember")
    assert reader["role"] == "roles/secretmanager.secretAccessor" and reader["member"].startswith("serviceAccount:gpu-train-rec-")
    assert url not in json.dumps(result.outputs, default=str)


def test_the_function_source_is_stdlib_only_and_loads(tmp_path: Path) -> None:
    files = recovery.source_files()
    for path, text in files.items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        if path.endswith(".py"):
            for node in ast.walk(parse_python(text)):
                if isinstance(node, ast.Import):
                    assert all(a.name.split(".")[0] in STDLIB | {"functions_framework"} for a in node.names), path
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    assert node.module.split(".")[0] in STDLIB | {"gpu_train_agent", "gpu_train", "__future__"}, (path, node.module)
    # -S: no site-packages (the laptop's gpu_train is not there in Google's cloud): the upload must carry it all.
    load = "import sys; sys.path.insert(0, ''); import main; print(main.on_event)"
    out = subprocess.run([sys.executable, "-I", "-S", "-c", load], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_a_secret_webhook_in_the_stack_file_is_taken_and_never_shown() -> None:
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.stack import config

    raw = {**gcp_raw(spot=True), "gpu-train:notify": {"secure": "v1:Zm9vYmFy"}}
    cfg = config.parse(raw, "s", load_catalog())
    assert cfg.notify == config.SECRET_VALUE
    with pytest.raises(config.ConfigError, match="secret, which gpu-train cannot use"):
        config.parse({**gcp_raw(), "gpu-train:zone": {"secure": "v1:Zm9vYmFy"}}, "s", load_catalog())


def test_a_long_stack_name_still_gives_a_function_cloud_run_takes(public_key: Path) -> None:
    raw = gcp_raw(spot=True)
    raw["gpu-train:sshPublicKey"] = str(public_key)
    result = preview.run(program.main, stack="a-rather-long-stack-name-for-the-big-h100-experiments", config=raw)
    assert result.error is None, result.error
    name = one(result, "cloudfunctionsv2/function:Function")["name"]
    assert len(name) <= recovery.FUNCTION_NAME_MAX and name.endswith("-recovery") and name.startswith("gpu-train-a-")
