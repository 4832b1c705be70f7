"""The Pulumi program: read the stack's settings, validate them, then declare the GPU VM.

Nothing is declared unless validation passed, so an invalid stack creates (and bills) nothing.
``declare`` is shared with ``scripts/plan``, which runs it under Pulumi's mock runtime. What the program
asks Google itself comes from the ``Lookups`` it is handed (infra/lookups.py): Google's for `pulumi up`,
recorded ones under the mocks.
"""

from __future__ import annotations

import pulumi
from pulumi.runtime.config import CONFIG, get_config_env

from agent import bundle
from gpu_train.catalog.loader import load_catalog
from gpu_train.catalog.model import Catalog
from gpu_train.gcp import provisioning, validate, vm
from gpu_train.gcp.pricing import hourly_cost
from gpu_train.stack import stackfile
from gpu_train.stack.problems import ConfigError
from gpu_train.stack.settings import StackConfig
from infra import quota_request
from infra.gpu_vm import GpuVm, GpuVmArgs
from infra.lookups import Lookups


def stack_settings() -> dict[str, object]:
    """Every config value of the stack: the engine passes them in PULUMI_CONFIG (or set_all_config)."""
    return {**get_config_env(), **CONFIG.get()}


def declare(cfg: StackConfig, public_key: str, catalog: Catalog, lookups: Lookups) -> GpuVm:
    """Declare the VM of a validated GCP stack and export what the fab tasks read."""
    shapes = validate.node_shapes(cfg, catalog)
    per_node = [hourly_cost(s, catalog).for_way(provisioning.way(cfg)) for s in shapes]
    known = [c for c in per_node if c is not None]
    cost = round(sum(known), 5) if len(known) == len(per_node) else None
    gpu_vm = GpuVm(
        "gpu",
        GpuVmArgs(
            cfg,
            shapes[0],
            public_key,
            pulumi.get_project(),
            cost,
            agent_zipapp=bundle.payload(),
            startup_template=vm.read_startup_template(),
            catalog=catalog,
            node_shapes=tuple(shapes) if cfg.pools else (),
        ),
    )
    shape = shapes[0]
    quota_request.declare(cfg, shape, gpu_vm, catalog, lookups)
    for key, value in gpu_vm.outputs.items():
        pulumi.export(key, value)
    return gpu_vm


def main(lookups: Lookups) -> None:
    stack = pulumi.get_stack()
    try:
        catalog = load_catalog()
        cfg, warnings = validate.check(stack_settings(), stack, catalog)
        if not cfg.is_gcp:
            pulumi.log.info(f"stack {stack} targets SSH hosts ({', '.join(map(str, cfg.hosts))}): nothing to create")
            pulumi.export("target", "ssh")
            return
        for warning in warnings:
            pulumi.log.warn(str(warning))
        public_key, problem = stackfile.read_public_key(cfg)
        if problem is not None:
            raise ConfigError([problem], stack)
    except ConfigError as e:
        raise pulumi.RunError(str(e)) from None
    assert public_key is not None  # read_public_key gives a key or a problem
    declare(cfg, public_key, catalog, lookups)
