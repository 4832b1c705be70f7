"""Run the real Pulumi program under Pulumi's mock runtime, recording what it declares.

This is how ``scripts/plan`` shows what ``pulumi up`` would create without credentials or the
Pulumi CLI, and how the tests inspect the program. The mocks sit at the outermost boundary: they
stand in for the engine and Google Cloud, answering with what the real API would fill in; what the
program asks Google itself it asks the recorded lookups it is handed here (``Recorded``).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import pulumi
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.settings import get_root_resource

from gpu_train.catalog.loader import load_catalog
from infra.lookups import Lookups

MOCK_EXTERNAL_IP = "203.0.113.10"  # documentation range (RFC 5737)
MOCK_INTERNAL_IP = "10.128.0.2"
MOCK_IMAGE_DISK_GB = 50


class ProviderError(grpc.RpcError):  # type: ignore[misc]  # (grpc ships no types: Any here)
    """A provider's failed invoke as the engine hands it back: a gRPC error whose details are the
    provider's text (the SDK turns it into "invoke of TOKEN failed: TEXT", as on a real `up`)."""

    def __init__(self, details: str):
        super().__init__(details)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNKNOWN

    def details(self) -> str:
        return self._details


@dataclass
class Declared:
    typ: str
    name: str
    inputs: dict[str, Any]
    provider: str = ""  # the provider reference (URN::id) a resource was declared with, "" for the default
    protect: bool = False
    retain_on_delete: bool = False
    import_id: str = ""  # the ``import`` option: the id of an existing resource to adopt
    ignore_changes: tuple[str, ...] = ()


@dataclass
class Recorder(pulumi.runtime.Mocks):
    """Records resources and answers invokes the way Google Cloud would."""

    image_disk_gb: int = MOCK_IMAGE_DISK_GB
    # Current limits by Cloud Quotas id: a number (the default entry, for every region) or the
    # dimensionsInfos as the API lists them ({dimensions, applicableLocations, value} each).
    quota_values: dict[str, int | list[dict[str, Any]]] = field(default_factory=dict[str, Any])
    # The image an existing VM's boot disk was created from (what the provider reads back after the
    # first `up`, whatever the family's newest is now); None: the VM is new.
    pinned_image: str | None = None
    pinned_image_disk_gb: int = MOCK_IMAGE_DISK_GB  # the pinned image's own minimum disk size
    resources: list[Declared] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (invoke token, provider reference)
    protected: dict[tuple[str, str], bool] = field(default_factory=dict)
    retained: dict[tuple[str, str], bool] = field(default_factory=dict)
    imports: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = field(default_factory=dict)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        outputs = dict(args.inputs)
        if args.typ == "gcp:compute/resourcePolicy:ResourcePolicy":
            project, region = args.inputs.get("project") or "project", args.inputs.get("region")
            outputs["selfLink"] = (
                f"https://www.googleapis.com/compute/v1/projects/{project}/regions/{region}/resourcePolicies/{args.inputs.get('name')}"
            )
        if args.typ == "gcp:compute/disk:Disk":
            project, zone = args.inputs.get("project") or "project", args.inputs.get("zone")
            outputs["selfLink"] = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/disks/{args.inputs.get('name')}"
        if args.typ == "gcp:serviceaccount/account:Account":
            project = args.inputs.get("project") or "project"
            outputs["email"] = f"{args.inputs['accountId']}@{project}.iam.gserviceaccount.com"
            outputs["uniqueId"] = str(int(hashlib.sha256(outputs["email"].encode()).hexdigest()[:15], 16))  # 21 digits
        if args.typ == "gcp:projects/iAMCustomRole:IAMCustomRole":  # what the provider reads back
            outputs["name"] = f"projects/{args.inputs.get('project') or 'project'}/roles/{args.inputs['roleId']}"
        if args.typ == "gcp:logging/projectSink:ProjectSink":  # unique_writer_identity: the sink's own account
            outputs["writerIdentity"] = "serviceAccount:service-123456789@gcp-sa-logging.iam.gserviceaccount.com"
        if args.typ == "gcp:pubsub/topic:Topic":
            outputs["id"] = f"projects/{args.inputs.get('project') or 'project'}/topics/{args.inputs['name']}"
        if args.typ == "gcp:compute/instance:Instance":
            nics = [dict(nic) for nic in args.inputs.get("networkInterfaces", [])]
            for nic in nics:
                nic["networkIp"] = MOCK_INTERNAL_IP
                nic["accessConfigs"] = [{**ac, "natIp": MOCK_EXTERNAL_IP} for ac in nic.get("accessConfigs", [])]
            outputs["networkInterfaces"] = nics
            if self.pinned_image and "bootDisk" in outputs:
                boot = dict(outputs["bootDisk"])
                boot["initializeParams"] = {**boot.get("initializeParams", {}), "image": self.pinned_image}
                outputs["bootDisk"] = boot
        protect = self.protected.get((args.typ, args.name), False)
        retain = self.retained.get((args.typ, args.name), False)
        import_id, ignore = self.imports.get((args.typ, args.name), ("", ()))
        self.resources.append(Declared(args.typ, args.name, dict(args.inputs), args.provider or "", protect, retain, import_id, ignore))
        return outputs.get("id") or f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> Any:  # a dict, or (dict, failures) as Mocks allows
        self.calls.append((args.token, args.provider or ""))
        if args.token == "gcp:compute/getInstance:getInstance":
            return self._instance(args.args)
        if args.token == "gcp:compute/getImage:getImage" and args.args.get("name"):
            return self._image_by_name(args.args)
        if args.token == "gcp:compute/getImage:getImage":
            family, project = args.args.get("family"), args.args.get("project")
            name = f"{family}-v20260416"
            return {
                "name": name,
                "family": family,
                "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/global/images/{name}",
                "diskSizeGb": self.image_disk_gb,
            }
        if args.token == "gcp:cloudquota/getSQuotaInfo:getSQuotaInfo":
            return {"dimensionsInfos": quota_infos(args.args.get("quotaId", ""), self.quota_values)}
        return {}

    def _instance(self, given: dict[str, Any]) -> dict[str, Any]:
        """An existing instance (``pinned_image`` set) as the data source reads it back, else the
        provider's 404 (terraform-provider-google's HandleDataSourceNotFoundError: "<id> not found",
        wrapped by the bridge)."""
        name, zone, project = given.get("name"), given.get("zone"), given.get("project") or "project"
        if not self.pinned_image:
            raise ProviderError(
                "invoking gcp:compute/getInstance:getInstance: 1 error occurred:\n"
                f"\t* projects/{project}/zones/{zone}/instances/{name} not found"
            )
        return {"name": name, "zone": zone, "project": project, "bootDisks": [{"initializeParams": [{"image": self.pinned_image}]}]}

    def _image_by_name(self, given: dict[str, Any]) -> dict[str, Any]:
        """An image looked up by name: the pinned one (of its own size); any other name is a 404."""
        name, project = given["name"], given.get("project") or "project"
        link = f"https://www.googleapis.com/compute/v1/projects/{project}/global/images/{name}"
        if link != self.pinned_image:
            raise ProviderError(
                "invoking gcp:compute/getImage:getImage: 1 error occurred:\n"
                f"\t* Error retrieving image {name}: googleapi: Error 404: The resource "
                f"'projects/{project}/global/images/{name}' was not found, notFound"
            )
        return {"name": name, "selfLink": link, "diskSizeGb": self.pinned_image_disk_gb}


class _Monitor(MockMonitor):
    """The mock monitor, also noting each registration's ``protect``, ``retain_on_delete``, ``import`` and
    ``ignore_changes`` options (MockResourceArgs leaves them out)."""

    def RegisterResource(self, request: Any) -> Any:  # (pulumi's mock monitor: a protobuf request, untyped)
        mocks = cast(Recorder, self.mocks)
        mocks.protected[(request.type, request.name)] = bool(request.protect)
        mocks.retained[(request.type, request.name)] = bool(request.retainOnDelete)
        mocks.imports[(request.type, request.name)] = (request.importId, tuple(request.ignoreChanges))
        return super().RegisterResource(request)  # type: ignore[no-untyped-call]  # (pulumi's MockMonitor is untyped)


def quota_infos(quota_id: str, values: dict[str, int | list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """A QuotaInfo's dimensionsInfos as Cloud Quotas lists them: a default entry with no dimensions
    whose applicableLocations name every region it covers (["global"] for project-wide quotas),
    and, where given, entries for specific dimensions (listed first, as the API may)."""
    given = values.get(quota_id, 0)
    if isinstance(given, list):
        return [
            {
                "dimensions": e.get("dimensions") or {},
                "applicableLocations": e["applicableLocations"],
                "details": [{"value": str(e["value"])}],
            }
            for e in given
        ]
    regions = sorted({z.rsplit("-", 1)[0] for zs in load_catalog().zones.values() for z in zs})
    places = ["global"] if quota_id.endswith("-per-project") else regions
    return [{"dimensions": {}, "applicableLocations": places, "details": [{"value": str(given)}]}]


@dataclass
class Recorded:
    """The program's lookups (infra.lookups.Lookups) answered from what a test or `scripts/plan` recorded."""

    # The project's quota preferences as Cloud Quotas lists them (quotaPreferences.list): what the
    # program asks before it declares one (infra/quota_request.existing_preferences).
    preferences: list[dict[str, Any]] = field(default_factory=list)

    def quota_preferences(self, project: str) -> list[dict[str, Any]]:
        return list(self.preferences)


@dataclass
class Preview:
    resources: list[Declared]
    outputs: dict[str, Any]
    error: BaseException | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)

    def of_type(self, suffix: str) -> list[Declared]:
        return [r for r in self.resources if r.typ.endswith(suffix)]


def run(
    program: Callable[[Lookups], Any],
    *,
    stack: str,
    config: dict[str, Any] | None = None,
    image_disk_gb: int = MOCK_IMAGE_DISK_GB,
    quota_values: dict[str, int | list[dict[str, Any]]] | None = None,
    pinned_image: str | None = None,
    pinned_image_disk_gb: int = MOCK_IMAGE_DISK_GB,
    quota_preferences: list[dict[str, Any]] | None = None,
    lookups: Lookups | None = None,
) -> Preview:
    """Run ``program`` as ``pulumi up`` would, under mocks, handed ``lookups`` (default: the recorded
    ``quota_preferences``); collect its resources and stack outputs.

    ``preview=False`` so that apply callbacks run (under preview they are skipped and an
    assertion inside one would pass silently). A program error is returned, not raised, the way
    ``pulumi up`` reports it.
    """
    recorder = Recorder(
        image_disk_gb=image_disk_gb, quota_values=quota_values or {}, pinned_image=pinned_image, pinned_image_disk_gb=pinned_image_disk_gb
    )
    given: Lookups = Recorded(list(quota_preferences or [])) if lookups is None else lookups
    pulumi.runtime.set_mocks(recorder, project="gpu-train", stack=stack, preview=False, monitor=_Monitor(recorder))
    pulumi.runtime.set_all_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in (config or {}).items()})
    root: Any = get_root_resource()  # the mock runtime's root Stack (its outputs dict is what we read)
    root.outputs.clear()  # the mock runtime keeps one root stack per process
    outputs: dict[str, Any] = {}
    error: BaseException | None = None

    @pulumi.runtime.test  # type: ignore[untyped-decorator]  # (pulumi declares it without types)
    def _run() -> Any:
        program(given)
        return pulumi.Output.all(**root.outputs).apply(outputs.update)

    try:
        _run()
    except Exception as e:
        error = e
        forget_failed_tasks()
    return Preview(recorder.resources, outputs, error, recorder.calls)


def forget_failed_tasks() -> None:
    """The program's error is returned to the caller; the registrations it failed stay as asyncio
    tasks whose exceptions nobody reads, which asyncio would print at exit. Let them go quietly.
    (Those the returned error still holds go when it does: tests.conftest.in_process calls this
    again once a script's main has returned, as the script's own exit would end them.)"""
    loop = asyncio.get_event_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, _context: None)
    gc.collect()
    loop.set_exception_handler(previous)
