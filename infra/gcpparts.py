"""pulumi-gcp with each resource loaded from its own module: ``from infra.gcpparts import gcp``.

pulumi-gcp's namespaces (``pulumi_gcp.compute``, ``.storage``, ...) import every resource they hold on
first use: 288 modules for compute alone. The program declares about twenty kinds, so most of what
`scripts/plan` and `pulumi up` spent importing pulumi-gcp went on resources it never declares (the
recovery's Cloud Run, storage and logging namespaces added a third to plan's CPU). Here each namespace
the program uses is a stand-in whose attributes load the one module that defines them (``PARTS``: the
names the program uses, each with its module in pulumi-gcp); a name not listed loads the whole namespace
into the stand-in, as pulumi-gcp would have, so nothing else changes. ``gcp`` is pulumi_gcp itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

# namespace -> {name: its module in pulumi_gcp/NAMESPACE/ (pulumi-gcp's own file names)}
PARTS: dict[str, dict[str, str]] = {
    "compute": {
        "Disk": "disk",
        "Firewall": "firewall",
        "Instance": "instance",
        "InstanceIAMMember": "instance_iam_member",
        "ResourcePolicy": "resource_policy",
        "GetImageResult": "get_image",
        "get_image": "get_image",
        "get_image_output": "get_image",
        "get_instance": "get_instance",
    },
    "storage": {
        "Bucket": "bucket",
        "BucketIAMMember": "bucket_iam_member",
        "BucketIAMMemberConditionArgs": "_inputs",
        "BucketObject": "bucket_object",
    },
    "artifactregistry": {"RepositoryIamMember": "repository_iam_member"},
    "cloudfunctionsv2": {"Function": "function", "FunctionServiceConfigSecretEnvironmentVariableArgsDict": "_inputs"},
    "cloudrunv2": {"ServiceIamMember": "service_iam_member"},
    "cloudquota": {
        "SQuotaPreference": "s_quota_preference",
        "get_s_quota_info_output": "get_s_quota_info",
    },
    "logging": {"ProjectSink": "project_sink"},
    "projects": {"IAMCustomRole": "iam_custom_role", "IAMMember": "iam_member", "Service": "service"},
    "pubsub": {"Topic": "topic", "TopicIAMMember": "topic_iam_member"},
    "secretmanager": {"Secret": "secret", "SecretIamMember": "secret_iam_member", "SecretVersion": "secret_version"},
    "serviceaccount": {"Account": "account"},
}


class _Namespace(types.ModuleType):
    """A namespace stand-in. Importing a submodule binds it on its package under its own name, as
    pulumi-gcp's own ``from .get_image import *`` then rebinds to the function: a listed name that is
    also its module's (get_image in get_image.py) keeps its function here."""

    parts: dict[str, str]

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, types.ModuleType) and self.__dict__.get("parts", {}).get(name) == name:
            value = getattr(value, name)
        super().__setattr__(name, value)


def _stand_in(namespace: str, parts: dict[str, str]) -> types.ModuleType:
    """``pulumi_gcp.NAMESPACE`` as a package whose attributes load one module each (the whole namespace
    for a name not in ``parts``)."""
    full = f"pulumi_gcp.{namespace}"
    spec = importlib.util.find_spec(full)
    assert spec is not None and spec.submodule_search_locations is not None, full
    module = _Namespace(full)
    module.parts = parts
    module.__spec__, module.__path__, module.__package__, module.__file__ = spec, list(spec.submodule_search_locations), full, spec.origin
    whole: list[bool] = []

    def __getattr__(name: str) -> object:
        part = parts.get(name)
        if part is not None:
            value = getattr(importlib.import_module(f"{full}.{part}"), name)
        elif any(os.path.exists(os.path.join(d, f"{name}.py")) for d in module.__path__):
            value = importlib.import_module(f"{full}.{name}")  # a module of the namespace (`from . import outputs`)
        else:
            if whole or name.startswith("__"):
                raise AttributeError(f"module {full!r} has no attribute {name!r}")
            whole.append(True)
            assert spec.loader is not None
            spec.loader.exec_module(module)  # pulumi-gcp's own __init__: every resource of the namespace
            value = module.__dict__[name] if name in module.__dict__ else __getattr__(name)
        setattr(module, name, value)
        return value

    vars(module)["__getattr__"] = __getattr__  # (PEP 562: a module's __getattr__ is found in its namespace)
    return module


def _install() -> None:
    import pulumi_gcp

    for namespace, parts in PARTS.items():
        full = f"pulumi_gcp.{namespace}"
        loaded = sys.modules.get(full)
        # pulumi-gcp puts a lazy module there (importlib's LazyLoader); one already loaded whole stays as it is.
        if loaded is None or type(loaded).__name__ == "_LazyModule":
            sys.modules[full] = stand_in = _stand_in(namespace, parts)
            setattr(pulumi_gcp, namespace, stand_in)


_install()

import pulumi_gcp as gcp  # noqa: E402

__all__ = ["PARTS", "gcp"]
