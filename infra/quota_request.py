"""`quotaRequest`: ask Cloud Quotas for GPU quota from `pulumi up` (gcp.cloudquota.SQuotaPreference).

Each preference asks for the larger of what the stack requests and what the project already has
(read with getSQuotaInfo at `up` time), so declaring one can never lower a quota.

Under a user's Application Default Credentials (`gcloud auth application-default login`, what the
README prescribes) Cloud Quotas refuses calls that carry no quota project. So the invoke and the
preferences go through their own provider with `userProjectOverride` and `billingProject` set to
the stack's project, and the stack enables `cloudquotas.googleapis.com` first (left enabled on
destroy: other tools of the project may use it). Without this `pulumi up` fails as a whole.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from gpu_train import names, quota
from gpu_train.catalog import Catalog
from gpu_train.config import StackConfig
from gpu_train.validate import GpuShape


def current_value(info, dimensions: dict[str, str]) -> int:
    """The limit in force for these dimensions (see quota.current_limit), 0 if none."""
    entries = [{"dimensions": dict(e.dimensions or {}), "applicableLocations": list(e.applicable_locations or []),
                "values": [d.value for d in e.details or []]} for e in info.dimensions_infos or []]
    return quota.current_limit(entries, dimensions)


CLOUD_QUOTAS_API = "cloudquotas.googleapis.com"


def declare(cfg: StackConfig, shape: GpuShape, parent: pulumi.Resource,
            catalog: Catalog) -> list[gcp.cloudquota.SQuotaPreference]:
    request = cfg.quota_request
    if not request:
        return []
    gpus = int(request["gpus"])
    parent_path = f"projects/{cfg.project}"
    provider = gcp.Provider("quotas", project=cfg.project, user_project_override=True, billing_project=cfg.project,
                            opts=pulumi.ResourceOptions(parent=parent))
    api = gcp.projects.Service("cloudquotas-api", project=cfg.project, service=CLOUD_QUOTAS_API, disable_on_destroy=False,
                               opts=pulumi.ResourceOptions(parent=parent, provider=provider))
    declared = []
    for pref in quota.preferences(cfg, shape, gpus, catalog):
        dims: dict[str, str] = pref["dimensions"]  # type: ignore[assignment]
        quota_id, want = str(pref["quota_id"]), int(str(pref["preferred"]))
        info = gcp.cloudquota.get_s_quota_info_output(parent=parent_path, service=quota.SERVICE,
                                                      quota_id=quota_id,
                                                      opts=pulumi.InvokeOutputOptions(parent=parent, provider=provider,
                                                                                      depends_on=[api]))
        preferred = info.apply(lambda i, d=dims, w=want: str(max(w, current_value(i, d))))  # type: ignore[misc]
        suffix = "-".join([quota_id.lower(), *dims.values()])
        declared.append(gcp.cloudquota.SQuotaPreference(
            f"quota-{suffix}",
            name=preference_id(str(pref["quota_id"]), dims),
            parent=parent_path,
            service=quota.SERVICE,
            quota_id=quota_id,
            dimensions=dims or None,
            quota_config={"preferred_value": preferred},
            justification=request["justification"],
            contact_email=request["contactEmail"],
            # Cloud Quotas cannot delete a preference (the provider only forgets it): say so, and keep it.
            opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=[api], retain_on_delete=True),
        ))
    return declared


def preference_id(quota_id: str, dimensions: dict[str, str]) -> str:
    """The preference's id, the same for every `up` of every stack of the project that asks for this quota
    (``gpu-train-QUOTA-DIMENSIONS``): asked twice, Cloud Quotas answers that it exists, never makes two."""
    return names.rfc1035("-".join(["gpu-train", quota_id.lower(), *dimensions.values()]), 63)
