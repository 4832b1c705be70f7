"""The stack's way back from a preemption, declared with its VMs (docs/recovery.md says why this way).

A log sink sends Compute Engine's ``compute.instances.preempted`` and ``hostError`` system events of
the stack's own VMs to a Pub/Sub topic; a Cloud Run function (2nd gen Cloud Functions, scale to
zero, one instance at most) runs ``agent.recovery_call.on_event`` (around the decisions of
``gpu_train.recovery``) for each, retried with
exponential backoff while the zone has no capacity. It runs as a service account of its own whose
only grants are a custom role on each of the stack's instances (get, start, stop, setLabels: its record
is labels, which need no actAs on the VM's service account, and metadata would be root on the VM),
another on the project for reading zone operations, the invoker role on its own service, and (with
``notify``) reading the webhook's secret. Everything here goes with `pulumi destroy`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pulumi

from gpu_train import recovery
from gpu_train.catalog.model import FLEX_START, SPOT
from gpu_train.gcp import names, provisioning
from gpu_train.stack.settings import StackConfig
from infra.gcpparts import gcp

ROOT = Path(__file__).resolve().parent.parent
# The function's modules, stdlib only (no other imports): the agent's webhook and Compute calls, and the
# recovery's decisions from the core (as the agent's zipapp carries them: gpu_train.recovery).
FUNCTION_MODULES = {
    "gpu_train_agent/__init__.py": "agent/__init__.py",
    "gpu_train_agent/notify.py": "agent/notify.py",
    "gpu_train_agent/recovery_call.py": "agent/recovery_call.py",
    "gpu_train/__init__.py": "",
    "gpu_train/recovery.py": "gpu_train/recovery.py",
    "gpu_train/atomic.py": "gpu_train/atomic.py",  # notify.py keeps the webhook URL on a host with it
}
RUNTIME = "python312"
ENTRY_POINT = "on_event"
MAIN = (
    '"""gpu-train: a preempted VM back by itself (agent/recovery_call.py)."""\n'
    "from gpu_train_agent.recovery_call import on_event\n\n"
    "try:  # the Functions Framework the runtime provides: a CloudEvent function\n"
    "    import functions_framework\n"
    "    on_event = functions_framework.cloud_event(on_event)\n"
    "except ImportError:\n"
    "    pass\n"
)
# The APIs the recovery needs (left enabled on destroy: other tools of the project may use them).
APIS = (
    "cloudfunctions.googleapis.com",
    "run.googleapis.com",
    "cloudbuild.googleapis.com",
    "artifactregistry.googleapis.com",
    "eventarc.googleapis.com",
    "pubsub.googleapis.com",
    "logging.googleapis.com",
)
SECRETS_API = "secretmanager.googleapis.com"
BUILD_ROLE = "roles/cloudbuild.builds.builder"  # what a custom build account of a function needs (Cloud Functions docs)
# What the function's identity may do to the stack's instances, and nothing else.
INSTANCE_PERMISSIONS = ("compute.instances.get", "compute.instances.start", "compute.instances.stop", "compute.instances.setLabels")
OPERATION_PERMISSIONS = ("compute.zoneOperations.get",)  # the start's outcome (capacity errors are there)
SELF_PERMISSIONS = ("compute.instances.get",)  # the VM's own account, on itself: it reads the record at boot
SUFFIX = names.RECOVERY_SUFFIX
FUNCTION_NAME_MAX = names.FUNCTION_NAME_MAX


def stops_for_good(cfg: StackConfig) -> bool:
    """VMs that Compute Engine leaves stopped after a preemption, a host error or host maintenance
    (automaticRestart false): spot and Flex-start ones. Standard and reservation-bound VMs restart by themselves."""
    return provisioning.way(cfg) in (SPOT, FLEX_START)


def wanted(cfg: StackConfig) -> bool:
    """Such a stack gets its way back unless recoverHours is 0."""
    return provisioning.recovered(cfg)


def label(cfg: StackConfig) -> dict[str, str]:
    """The instances' label the function reads: on while the stack wants its VMs back (running: true)."""
    return {recovery.LABEL: "on" if wanted(cfg) and cfg.running else "off"} if stops_for_good(cfg) else {}


def describe(cfg: StackConfig) -> str:
    """`plan`'s line about it."""
    if not wanted(cfg):
        return "Recovery: off (recoverHours 0): a preempted VM stays stopped until vm-start"
    return (
        f"Recovery: a preempted VM is started again by the stack's own function for up to {cfg.recover_hours:g} h "
        "(log sink, Pub/Sub, Cloud Run function; nothing runs and nothing bills while no VM is preempted; "
        "docs/recovery.md)"
    )


def log_filter(project: str, zone: str, instances: list[str]) -> str:
    """The sink's filter: the system events (preempted, host error, host maintenance), of these instances only.
    Only stacks whose VMs do not restart themselves (``stops_for_good``) have a sink at all."""
    methods = " OR ".join(f'"{m}"' for m in recovery.EVENTS)
    targets = " OR ".join(f'"projects/{project}/zones/{zone}/instances/{n}"' for n in instances)
    return (
        f'logName="projects/{project}/logs/cloudaudit.googleapis.com%2Fsystem_event" '
        f"AND protoPayload.methodName=({methods}) AND protoPayload.resourceName=({targets})"
    )


def source_files() -> dict[str, str]:
    """The function's source, as uploaded: main.py and the stdlib modules it runs."""
    files = {"main.py": MAIN, "requirements.txt": "functions-framework>=3.5,<4\n"}
    for name, source in FUNCTION_MODULES.items():
        files[name] = (ROOT / source).read_text(encoding="utf-8") if source else ""
    return files


def role_id(stack: str, what: str, account_unique_id: str) -> str:
    """A custom role id (letters, digits, '_', 3 to 64 characters) of this incarnation of the stack: IAM keeps
    a deleted role's id for 37 days (after 7 it cannot be undeleted either), so a stack taken down and put
    up again within that time needs a new one; the function's service account's unique id (new for each
    account made) gives it."""
    base = "gpuTrain_" + "".join(c if c.isalnum() else "_" for c in stack)
    digest = hashlib.sha256(stack.encode()).hexdigest()[:6]
    return (base[:36] + "_" + digest if len(base) > 36 else base) + f"_{what}_{account_unique_id[-8:]}"


@dataclass(frozen=True)
class _Place:
    """Where the recovery's resources go: the component's name (``prefix``), the stack, the parent."""

    prefix: str
    cfg: StackConfig
    parent: pulumi.Resource

    def name(self, what: str) -> str:
        return f"{self.prefix}-{SUFFIX}-{what}"

    @property
    def child(self) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self.parent)

    @property
    def project(self) -> str:
        return self.cfg.project or ""


def declare(
    prefix: str,
    cfg: StackConfig,
    instances: list[gcp.compute.Instance],
    instance_names: list[str],
    parent: pulumi.Resource,
    vm_account: pulumi.Output[str] | None = None,
) -> gcp.cloudfunctionsv2.Function | None:
    """The recovery's resources (``prefix``: the component's name), or nothing where it does not apply: the
    APIs, the function's identity and grants, the log sink and topic that carry the events, the source and
    its build, the webhook's secret, and the function itself."""
    if not wanted(cfg):
        return None
    place = _Place(prefix, cfg, parent)
    apis = [
        gcp.projects.Service(
            place.name(f"{api.split('.')[0]}-api"), project=place.project, service=api, disable_on_destroy=False, opts=place.child
        )
        for api in (*APIS, *((SECRETS_API,) if cfg.notify else ()))
    ]
    after_apis = pulumi.ResourceOptions(parent=parent, depends_on=apis)
    account, grants = _identity(place, instances, vm_account)
    member = account.email.apply(lambda email: f"serviceAccount:{email}")
    topic = _events(place, instance_names, after_apis)
    bucket, source, builder, build_grants = _source(place, after_apis)
    env = {
        recovery.STACK_ENV: cfg.stack,
        recovery.NODES_ENV: ",".join(instance_names),
        recovery.HOURS_ENV: f"{cfg.recover_hours:g}",
        recovery.PROJECT_ENV: place.project,
        recovery.ZONE_ENV: cfg.zone,
    }
    secrets, secret_deps = _notify_secret(place, member, after_apis) if cfg.notify else ([], [])
    function: gcp.cloudfunctionsv2.Function = gcp.cloudfunctionsv2.Function(
        place.name("function"),
        # Cloud Run names the function's service after it (63 characters at most) and each revision after that
        # (NAME-00001-abc, 63 at most too): 49 leaves the revisions room.
        name=names.recovery_name(cfg.stack),
        project=place.project,
        location=cfg.region,
        description=f"gpu-train {cfg.stack}: starts the stack's VMs again after a preemption (docs/recovery.md)",
        build_config={
            "runtime": RUNTIME,
            "entry_point": ENTRY_POINT,
            "source": {"storage_source": {"bucket": bucket.name, "object": source.name}},
            "service_account": builder.email.apply(lambda email: f"projects/{place.project}/serviceAccounts/{email}"),
        },
        service_config={
            "max_instance_count": 1,
            "min_instance_count": 0,
            "available_memory": "256M",
            "timeout_seconds": 300,
            "ingress_settings": "ALLOW_INTERNAL_ONLY",
            "all_traffic_on_latest_revision": True,
            "service_account_email": account.email,
            "environment_variables": env,
            "secret_environment_variables": secrets,
        },
        event_trigger={
            "trigger_region": cfg.region,
            "event_type": "google.cloud.pubsub.topic.v1.messagePublished",
            "pubsub_topic": topic.id,
            "retry_policy": "RETRY_POLICY_RETRY",
            "service_account_email": account.email,
        },
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[*grants, *apis, *build_grants, *secret_deps]),
    )
    gcp.cloudrunv2.ServiceIamMember(
        place.name("invoker"),
        project=place.project,
        location=cfg.region,
        name=function.name,
        role="roles/run.invoker",
        member=member,
        opts=place.child,
    )
    return function


def _identity(
    place: _Place, instances: list[gcp.compute.Instance], vm_account: pulumi.Output[str] | None
) -> tuple[gcp.serviceaccount.Account, list[pulumi.Resource]]:
    """The function's own account, with roles bound on the stack's instances only (get, start, stop, labels)
    and to read zone operations; and each VM's right to read its own labels (the record) at boot."""
    cfg, project, child = place.cfg, place.project, place.child
    account = gcp.serviceaccount.Account(
        place.name("sa"),
        account_id=names.recovery_account_id(cfg.stack),
        project=project,
        opts=child,
        display_name=f"gpu-train {cfg.stack} recovery",
        description="Starts the stack's preempted VMs again: may get, start, stop them and set their labels only.",
    )
    member = account.email.apply(lambda email: f"serviceAccount:{email}")
    start_role = gcp.projects.IAMCustomRole(
        place.name("instances-role"),
        project=project,
        opts=child,
        role_id=account.unique_id.apply(lambda u: role_id(cfg.stack, "recover", u)),
        title=f"gpu-train {cfg.stack}: start preempted VMs",
        permissions=list(INSTANCE_PERMISSIONS),
        description="Bound on the stack's instances only, for its recovery function.",
    )
    ops_role = gcp.projects.IAMCustomRole(
        place.name("operations-role"),
        project=project,
        opts=child,
        role_id=account.unique_id.apply(lambda u: role_id(cfg.stack, "operations", u)),
        title=f"gpu-train {cfg.stack}: read zone operations",
        permissions=list(OPERATION_PERMISSIONS),
        description="Lets the recovery function read how a start it asked for ended.",
    )
    grants: list[pulumi.Resource] = [
        gcp.compute.InstanceIAMMember(
            place.name(f"start-{i}"),
            project=project,
            zone=cfg.zone,
            instance_name=inst.name,
            role=start_role.name,
            member=member,
            opts=child,
        )
        for i, inst in enumerate(instances)
    ]
    grants.append(gcp.projects.IAMMember(place.name("operations"), project=project, role=ops_role.name, member=member, opts=child))
    if vm_account is not None:  # each VM reads its own labels (the record) at boot: get, on itself only
        self_role = gcp.projects.IAMCustomRole(
            place.name("self-role"),
            project=project,
            opts=child,
            role_id=account.unique_id.apply(lambda u: role_id(cfg.stack, "self", u)),
            title=f"gpu-train {cfg.stack}: a VM reads itself",
            permissions=list(SELF_PERMISSIONS),
            description="Bound on each of the stack's instances for that VM's own account: it reads the recovery's record.",
        )
        vm_member = vm_account.apply(lambda email: f"serviceAccount:{email}")
        for i, inst in enumerate(instances):
            gcp.compute.InstanceIAMMember(
                place.name(f"self-{i}"),
                project=project,
                zone=cfg.zone,
                instance_name=inst.name,
                role=self_role.name,
                member=vm_member,
                opts=child,
            )
    return account, grants


def _events(place: _Place, instance_names: list[str], after_apis: pulumi.ResourceOptions) -> gcp.pubsub.Topic:
    """The log sink that sends the stack's preemptions, host errors and maintenance to a topic of its own."""
    cfg, project = place.cfg, place.project
    name = names.recovery_name(cfg.stack)
    topic = gcp.pubsub.Topic(
        place.name("topic"), name=name, project=project, opts=after_apis, labels={"gpu-train-stack": names.rfc1035(cfg.stack, 63)}
    )
    sink = gcp.logging.ProjectSink(
        place.name("sink"),
        name=name,
        project=project,
        unique_writer_identity=True,
        opts=after_apis,
        destination=topic.name.apply(lambda t: f"pubsub.googleapis.com/projects/{project}/topics/{t}"),
        filter=log_filter(project, cfg.zone, instance_names),
        description=f"gpu-train {cfg.stack}: preemptions, host errors and host maintenance of the stack's VMs, for its recovery",
    )
    gcp.pubsub.TopicIAMMember(
        place.name("sink-publishes"),
        project=project,
        topic=topic.name,
        role="roles/pubsub.publisher",
        member=sink.writer_identity,
        opts=place.child,
    )
    return topic


def _source(
    place: _Place, after_apis: pulumi.ResourceOptions
) -> tuple[gcp.storage.Bucket, gcp.storage.BucketObject, gcp.serviceaccount.Account, list[pulumi.Resource]]:
    """The function's source (a zip in a bucket of its own) and the account that builds it, with its grants."""
    cfg, project, child = place.cfg, place.project, place.child
    bucket = gcp.storage.Bucket(
        place.name("source"),
        name=names.recovery_bucket_name(cfg.stack, project),
        project=project,
        location=cfg.region.upper(),
        force_destroy=True,
        uniform_bucket_level_access=True,
        public_access_prevention="enforced",
        soft_delete_policy={"retention_duration_seconds": 0},  # replaced source zips: nothing to keep for 7 days
        opts=after_apis,
    )
    # The build runs as an account of the stack's own: since 2024 new projects may give the default build
    # account (the Compute Engine default one) no roles, and then the function never builds.
    builder = gcp.serviceaccount.Account(
        place.name("build-sa"),
        account_id=names.recovery_build_account_id(cfg.stack),
        project=project,
        opts=child,
        display_name=f"gpu-train {cfg.stack} recovery build",
        description="Builds the stack's recovery function: Cloud Build's builder role, and reads its source.",
    )
    builder_member = builder.email.apply(lambda email: f"serviceAccount:{email}")
    build_grants: list[pulumi.Resource] = [
        gcp.projects.IAMMember(place.name("build-role"), project=project, role=BUILD_ROLE, member=builder_member, opts=child),
        gcp.storage.BucketIAMMember(
            place.name("build-source"), bucket=bucket.name, role="roles/storage.objectViewer", member=builder_member, opts=child
        ),
    ]
    files = source_files()
    digest = hashlib.sha256("".join(f"{k}\0{v}\0" for k, v in sorted(files.items())).encode()).hexdigest()[:16]
    source = gcp.storage.BucketObject(
        place.name("source-zip"),
        bucket=bucket.name,
        name=f"recovery-{digest}.zip",
        opts=child,
        source=pulumi.AssetArchive({path: pulumi.StringAsset(text) for path, text in files.items()}),
    )
    return bucket, source, builder, build_grants


def _notify_secret(
    place: _Place, member: pulumi.Output[str], after_apis: pulumi.ResourceOptions
) -> tuple[list[gcp.cloudfunctionsv2.FunctionServiceConfigSecretEnvironmentVariableArgsDict], list[pulumi.Resource]]:
    """The webhook kept in Secret Manager, readable by the function only: (its env reference, what to wait for)."""
    cfg, project, child = place.cfg, place.project, place.child
    secret = gcp.secretmanager.Secret(
        place.name("notify"),
        secret_id=names.resource_name(cfg.stack, "notify"),
        project=project,
        replication={"auto": {}},
        opts=after_apis,
    )
    version = gcp.secretmanager.SecretVersion(
        place.name("notify-value"), secret=secret.id, opts=child, secret_data=pulumi.Output.secret(cfg.notify)
    )
    reader = gcp.secretmanager.SecretIamMember(
        place.name("notify-reader"),
        project=project,
        secret_id=secret.secret_id,
        role="roles/secretmanager.secretAccessor",
        member=member,
        opts=child,
    )
    return [{"key": recovery.NOTIFY_ENV, "project_id": project, "secret": secret.secret_id, "version": version.version}], [version, reader]
