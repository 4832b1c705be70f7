"""`quotaRequest`: ask Cloud Quotas for GPU quota from `pulumi up` (gcp.cloudquota.SQuotaPreference).

Each preference asks for the larger of what the stack requests and what the project already has
(read with getSQuotaInfo at `up` time), so declaring one can never lower a quota.

Under a user's Application Default Credentials (`gcloud auth application-default login`, what the
README prescribes) Cloud Quotas refuses calls that carry no quota project. So the invoke and the
preferences go through their own provider with `userProjectOverride` and `billingProject` set to
the stack's project, and the stack enables `cloudquotas.googleapis.com` first (left enabled on
destroy: other tools of the project may use it). Without this `pulumi up` fails as a whole.

A preference outlives the stack that made it (Cloud Quotas cannot delete one: it is declared
retain_on_delete), and Cloud Quotas holds one per quota and dimensions. So before declaring one the
program asks Cloud Quotas which the project has (through the lookups it is handed: infra/lookups.py); one that exists (from an
earlier `up` of this stack before a destroy, another stack, the console) is adopted with the ``import``
option under its own id, with its own values, since Pulumi imports only a resource whose inputs match it
exactly. Its justification and contact email are ``ignore_changes``: the provider never reads them back,
so no import could match them. An adopted preference is never changed by an `up`: when the stack asks
for more, a warning says so and gives the gcloud command that raises it.
"""

from __future__ import annotations

import functools
from typing import Any

import pulumi

from gpu_train.catalog.model import Catalog
from gpu_train.gcp import names, quota
from gpu_train.gcp.validate import GpuShape
from gpu_train.stack.settings import StackConfig
from infra.gcpparts import gcp
from infra.lookups import CannotAsk, Lookups


def preferred_value(want: int, dimensions: dict[str, str], info: Any) -> str:
    """The limit to ask for: ``want``, or the one in force where that is higher (never a decrease)."""
    return str(max(want, current_value(info, dimensions)))


def current_value(info: Any, dimensions: dict[str, str]) -> int:  # (Cloud Quotas' QuotaInfo: google.cloud is untyped here)
    """The limit in force for these dimensions (see quota.current_limit), 0 if none."""
    entries = [
        {
            "dimensions": dict(e.dimensions or {}),
            "applicableLocations": list(e.applicable_locations or []),
            "values": [d.value for d in e.details or []],
        }
        for e in info.dimensions_infos or []
    ]
    return quota.current_limit(entries, dimensions)


CLOUD_QUOTAS_API = "cloudquotas.googleapis.com"


def declare(
    cfg: StackConfig, shape: GpuShape, parent: pulumi.Resource, catalog: Catalog, lookups: Lookups
) -> list[gcp.cloudquota.SQuotaPreference]:
    request = cfg.quota_request
    if not request:
        return []
    gpus = int(request["gpus"])
    parent_path = f"projects/{cfg.project}"
    provider = gcp.Provider(
        "quotas", project=cfg.project, user_project_override=True, billing_project=cfg.project, opts=pulumi.ResourceOptions(parent=parent)
    )
    api = gcp.projects.Service(
        "cloudquotas-api",
        project=cfg.project,
        service=CLOUD_QUOTAS_API,
        disable_on_destroy=False,
        opts=pulumi.ResourceOptions(parent=parent, provider=provider),
    )
    declared = []
    found = existing_preferences(cfg.project or "", lookups)
    for pref in quota.preferences(cfg, shape, gpus, catalog):
        dims, quota_id, want = pref["dimensions"], pref["quota_id"], pref["preferred"]
        suffix = "-".join([quota_id.lower(), *dims.values()])
        try:
            existing = quota.existing_preference(found, quota.SERVICE, quota_id, dims)
        except ValueError as e:
            raise pulumi.RunError(f"quotaRequest: {e}") from None
        if existing is not None:
            declared.append(
                adopt(
                    cfg,
                    quota.adoption(existing, want),
                    quota_id,
                    dims,
                    f"quota-{suffix}",
                    want,
                    pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=[api]),
                )
            )
            continue
        info = gcp.cloudquota.get_s_quota_info_output(
            parent=parent_path,
            service=quota.SERVICE,
            quota_id=quota_id,
            opts=pulumi.InvokeOutputOptions(parent=parent, provider=provider, depends_on=[api]),
        )
        preferred = info.apply(functools.partial(preferred_value, want, dims))
        declared.append(
            gcp.cloudquota.SQuotaPreference(
                f"quota-{suffix}",
                name=preference_id(quota_id, dims),
                parent=parent_path,
                service=quota.SERVICE,
                quota_id=quota_id,
                dimensions=dims or None,
                quota_config={"preferred_value": preferred},
                justification=request["justification"],
                contact_email=request["contactEmail"],
                # Cloud Quotas cannot delete a preference (the provider only forgets it): say so, and keep it.
                opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=[api], retain_on_delete=True),
            )
        )
    return declared


def preference_id(quota_id: str, dimensions: dict[str, str]) -> str:
    """The preference's id, the same for every `up` of every stack of the project that asks for this quota
    (``gpu-train-QUOTA-DIMENSIONS``): asked twice, Cloud Quotas answers that it exists, never makes two."""
    return names.rfc1035("-".join(["gpu-train", quota_id.lower(), *dimensions.values()]), 63)


def existing_preferences(project: str, lookups: Lookups) -> list[dict[str, Any]]:
    """The project's quota preferences; [] with a warning when Cloud Quotas cannot be asked: each is then
    created, and one that exists fails the `up` with a 409."""
    try:
        return lookups.quota_preferences(project)
    except CannotAsk as e:
        pulumi.log.warn(
            f"quotaRequest: cannot ask Cloud Quotas which quota preferences project {project} already has "
            f"({e}); each is created, and one that exists fails with a 409 (Requested entity already exists)"
        )
        return []


def adopt(
    cfg: StackConfig,
    adopted: quota.Adoption,
    quota_id: str,
    dims: dict[str, str],
    resource_name: str,
    want: int,
    opts: pulumi.ResourceOptions,
) -> gcp.cloudquota.SQuotaPreference:
    """The existing preference, declared with exactly the values it has, to be imported (or, once in the
    stack's state, left as it is)."""
    request = cfg.quota_request or {}
    if adopted.short_by:
        where = ",".join(f"{k}={v}" for k, v in dims.items())
        flags = f" --dimensions={where}" if dims else ""
        pulumi.log.warn(
            f"quotaRequest: Cloud Quotas already holds preference {adopted.name} for {quota_id}"
            f"{f' ({where})' if where else ''}, asking for {adopted.preferred} "
            f"(granted: {adopted.granted or 'not yet'}); this stack asks for {want}. "
            "It is adopted as it is (an up can import it or change it, not both; it may be another stack's). "
            f"To ask for {want}: gcloud quotas preferences update {adopted.name} --project={cfg.project} "
            f"--service={quota.SERVICE} --quota-id={quota_id}{flags} --preferred-value={want}"
        )
    return gcp.cloudquota.SQuotaPreference(
        resource_name,
        name=adopted.name,
        parent=f"projects/{cfg.project}",
        service=quota.SERVICE,
        quota_id=quota_id,
        dimensions=dims or None,
        quota_config={"preferred_value": adopted.preferred},
        justification=request.get("justification"),
        contact_email=request.get("contactEmail"),
        opts=pulumi.ResourceOptions.merge(
            opts,
            pulumi.ResourceOptions(
                import_=quota.preference_import_id(cfg.project or "", adopted.name),
                ignore_changes=["justification", "contactEmail"],
                retain_on_delete=True,
            ),
        ),
    )
