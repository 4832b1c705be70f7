"""GpuVm: a Deep Learning VM with GPUs, its own service account and SSH from chosen ranges only.

A thin Pulumi layer: every setting comes from ``gpu_train.gcp.vm`` and ``names`` (pure decisions) and a validated
StackConfig; this module only declares resources, each parented to the component.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pulumi

from gpu_train.catalog.model import Catalog
from gpu_train.gcp import names, provisioning, vm
from gpu_train.gcp.validate import GpuShape
from gpu_train.stack.pools import boot_disk_type
from gpu_train.stack.settings import StackConfig
from infra import bucket, recovery, registry
from infra.gcpparts import gcp


@dataclass(frozen=True)
class GpuVmArgs:
    """Everything the component needs, already validated."""

    config: StackConfig
    shape: GpuShape  # node 0's (the chief's)
    public_key: str
    pulumi_project: str
    hourly_cost_usd: float | None
    agent_zipapp: bytes  # the on-host agent the startup script installs (agent.bundle)
    startup_template: str  # gpu_train/data/startup-script.sh.in (vm.read_startup_template)
    catalog: Catalog
    node_shapes: tuple[GpuShape, ...] = ()  # one per node; empty: every node has ``shape``


def existing_boot_image(cfg: StackConfig, instance_name: str, parent: pulumi.Resource) -> str | None:
    """The image the existing instance ``instance_name`` booted from (its boot disk's source image, a
    self link), or None when there is no such instance yet. The data source fails with
    "projects/P/zones/Z/instances/N not found" on a 404 (the provider's HandleDataSourceNotFoundError);
    any other failure (permissions, API disabled) is the user's to see, not a first `up`."""
    try:
        found = gcp.compute.get_instance(name=instance_name, zone=cfg.zone, project=cfg.project, opts=pulumi.InvokeOptions(parent=parent))
    except Exception as e:
        if f"/instances/{instance_name} not found" in str(e):
            return None
        raise
    params = found.boot_disks[0].initialize_params if found.boot_disks else []
    return (params[0].image or None) if params else None


def boot_disk_size(cfg: StackConfig, image_gb: int | None, image: str) -> int:
    """The boot disk size to declare: bootDiskSizeGb, refused (naming the setting and the fix) where
    ``image`` needs more, since Compute Engine would fail the instance halfway through `up`."""
    if image_gb and cfg.boot_disk_size_gb < image_gb:
        raise ValueError(
            f"gpu-train:bootDiskSizeGb = {cfg.boot_disk_size_gb}: {image} needs at least {image_gb} GB; "
            f"fix: pulumi config set gpu-train:bootDiskSizeGb {max(image_gb, 200)}"
        )
    return cfg.boot_disk_size_gb


def image_project_and_name(link: str) -> tuple[str | None, str]:
    """(project, name) of an image self link (".../projects/P/global/images/N"); a bare name has no project."""
    parts = link.rstrip("/").split("/")
    if "projects" in parts and "images" in parts:
        return parts[parts.index("projects") + 1], parts[-1]
    return None, parts[-1]


class GpuVm(pulumi.ComponentResource):
    instance: gcp.compute.Instance
    image: pulumi.Output[str]

    def __init__(self, name: str, args: GpuVmArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-train:index:GpuVm", name, None, opts)
        cfg, shape, catalog = args.config, args.shape, args.catalog
        shapes = list(args.node_shapes) or [shape] * cfg.nodes
        self._firewall(name, cfg)
        account, grants = self._identity(name, cfg, args.pulumi_project)
        policy_link = self._placement(name, cfg, shapes, catalog)
        # Resolved at `up` time from the family, then pinned: the instance ignores later changes of
        # the family's newest image, so a re-run of `pulumi up` never replaces the VM (and its disk).
        newest = gcp.compute.get_image_output(family=cfg.image_family, project=cfg.image_project, opts=pulumi.InvokeOptions(parent=self))
        instance_names = names.node_names(cfg.stack, cfg.nodes)
        self.data_disks = [self._data_disk(name, cfg, i, vm.data_disk_type(cfg, catalog, shapes[i].machine_type)) for i in range(cfg.nodes)]
        self.instances = self._instances(name, args, shapes, instance_names, newest, account, grants, policy_link)
        self.instance = self.instances[0]  # node 0 leads (torchrun's master, TF's chief)
        # Spot: started again after a preemption by a function of the stack's own (infra/recovery.py).
        self.recovery = recovery.declare(name, cfg, self.instances, instance_names, self, account.email)
        # The image the VM runs: the boot disk's, as the provider reads it back. After the first `up`
        # it stays the image pinned then (initializeParams.image is ignored afterwards), while the
        # family moves on; exporting the family's newest would name an image the VM never booted.
        self.image = self.instance.boot_disk.initialize_params.image
        self.outputs = self._outputs(args, shapes)
        self.register_outputs(self.outputs)

    def _ingress(self, name: str, cfg: StackConfig, suffix: str, description: str, **rule: Any) -> gcp.compute.Firewall:
        """An ingress rule of the stack's network for this VM's tag."""
        return gcp.compute.Firewall(
            f"{name}-{suffix}",
            name=names.resource_name(cfg.stack, suffix),
            project=cfg.project,
            network=cfg.network,
            direction="INGRESS",
            target_tags=[names.network_tag(cfg.stack)],
            description=f"gpu-train {cfg.stack}: {description}",
            opts=pulumi.ResourceOptions(parent=self),
            **rule,
        )

    def _firewall(self, name: str, cfg: StackConfig) -> None:
        """SSH from the stack's ranges only (each family's allow above a deny of the rest); a cluster's nodes
        talk to each other freely (NCCL, rendezvous, TF servers, the code node 0 passes on), nothing new from outside."""
        for family, ranges in vm.ssh_ranges_by_family(cfg.ssh_source_ranges).items():
            self._ingress(
                name,
                cfg,
                f"ssh-{family}",
                "SSH from the stack's sshSourceRanges only",
                priority=vm.SSH_ALLOW_PRIORITY,
                allows=[{"protocol": "tcp", "ports": ["22"]}],
                source_ranges=ranges,
            )
            self._ingress(
                name,
                cfg,
                f"ssh-deny-{family}",
                "no SSH from anywhere else (overrides default-allow-ssh)",
                priority=vm.SSH_DENY_PRIORITY,
                denies=[{"protocol": "tcp", "ports": ["22"]}],
                source_ranges=["::/0" if family == "ipv6" else "0.0.0.0/0"],
            )
        if cfg.nodes > 1:
            self._ingress(
                name,
                cfg,
                "internal",
                "traffic between the cluster's nodes",
                source_tags=[names.network_tag(cfg.stack)],
                priority=vm.INTERNAL_PRIORITY,
                allows=[{"protocol": "tcp"}, {"protocol": "udp"}, {"protocol": "icmp"}],
            )

    def _identity(self, name: str, cfg: StackConfig, pulumi_project: str) -> tuple[gcp.serviceaccount.Account, list[pulumi.Resource]]:
        """The VM's own service account (logs and metrics, the stack's bucket prefix), and its grants."""
        child = pulumi.ResourceOptions(parent=self)
        account = gcp.serviceaccount.Account(
            f"{name}-sa",
            account_id=names.service_account_id(cfg.stack),
            display_name=f"gpu-train {cfg.stack} VM",
            description="Writes logs and metrics only; replaces the default compute service account.",
            project=cfg.project,
            opts=child,
        )
        grants: list[pulumi.Resource] = [
            gcp.projects.IAMMember(
                f"{name}-{role.split('/')[-1]}",
                project=cfg.project,
                role=role,
                member=account.email.apply(lambda email: f"serviceAccount:{email}"),
                opts=child,
            )
            for role in vm.SERVICE_ACCOUNT_ROLES
        ]
        grants += bucket.declare(name, cfg, account.email, vm.labels(cfg, pulumi_project), self)
        grants += registry.declare(name, cfg, account.email, self)  # gpu-train:image in Artifact Registry
        return account, grants

    def _placement(self, name: str, cfg: StackConfig, shapes: list[GpuShape], catalog: Catalog) -> pulumi.Output[str] | None:
        """A compact placement policy for a cluster whose series takes one (low latency for NCCL), or None."""
        policy = vm.placement_policy(cfg.nodes, sorted({s.machine_type for s in shapes}), catalog)
        if policy is None:
            return None
        # The plain dicts of gpu_train.gcp.vm are what pulumi_gcp's *ArgsDict types spell out.
        made = gcp.compute.ResourcePolicy(
            f"{name}-placement",
            name=names.resource_name(cfg.stack, names.PLACEMENT_SUFFIX),
            project=cfg.project,
            region=cfg.region,
            group_placement_policy=cast("gcp.compute.ResourcePolicyGroupPlacementPolicyArgsDict", policy),
            description=f"gpu-train {cfg.stack}: keep the {cfg.nodes} nodes close (low latency for NCCL)",
            opts=pulumi.ResourceOptions(parent=self),
        )
        return made.self_link

    def _instances(
        self,
        name: str,
        args: GpuVmArgs,
        shapes: list[GpuShape],
        instance_names: list[str],
        newest: pulumi.Output[gcp.compute.GetImageResult],
        account: gcp.serviceaccount.Account,
        grants: list[pulumi.Resource],
        policy_link: pulumi.Output[str] | None,
    ) -> list[gcp.compute.Instance]:
        """One instance per node, each with its own data disk attached (created apart: it outlives the VM)."""
        cfg, catalog = args.config, args.catalog

        def nic(machine_type: str) -> dict[str, object]:
            out: dict[str, object] = {"network": cfg.network, "access_configs": [{}]}
            if (kind := vm.nic_type(machine_type, catalog)) is not None:
                out["nic_type"] = kind
            return out

        metadata = vm.metadata(cfg, args.public_key, args.agent_zipapp, args.startup_template)
        # Each node's boot disk against the image it boots: an existing node keeps the image of its own
        # first `up` (nodes added later get the newest), so a bigger newest image refuses no one.
        boot_images = [self._boot_image(cfg, instance_name, newest) for instance_name in instance_names]
        return [
            gcp.compute.Instance(  # type: ignore[call-overload]  # (gpu_train.gcp.vm's plain dicts: the core has no pulumi_gcp types)
                name if cfg.nodes == 1 else f"{name}-{i}",
                name=instance_name,
                project=cfg.project,
                zone=cfg.zone,
                machine_type=shapes[i].machine_type,
                boot_disk={
                    "auto_delete": True,
                    "initialize_params": {
                        "image": boot_images[i][0],
                        "size": boot_images[i][1],
                        "type": boot_disk_type(cfg, shapes[i].machine_type, catalog),
                    },
                },
                # Attached, not created with the VM: a replaced VM (any replace-only field) gets the same
                # disk back, by the same device name, so runs and checkpoints carry over.
                attached_disks=[{"source": self.data_disks[i].self_link, "device_name": vm.DATA_DEVICE_NAME, "mode": "READ_WRITE"}],
                guest_accelerators=vm.guest_accelerators(shapes[i]),
                scheduling=provisioning.scheduling(cfg, catalog, shapes[i].machine_type),
                reservation_affinity=provisioning.reservation_affinity(cfg),
                desired_status=vm.node_desired_status(cfg, shapes[i].machine_type, catalog),
                network_interfaces=[nic(shapes[i].machine_type)],
                service_account={"email": account.email, "scopes": vm.scopes(cfg)},
                metadata=metadata,
                tags=[names.network_tag(cfg.stack)],
                labels={**vm.labels(cfg, args.pulumi_project), "gpu-train-node": str(i), **recovery.label(cfg)},
                resource_policies=policy_link,  # one policy per instance is all Compute Engine takes
                allow_stopping_for_update=True,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=grants,
                    # A fixed name cannot exist twice, so a replacement deletes first.
                    delete_before_replace=True,
                    ignore_changes=vm.instance_ignore_changes(shapes[i].machine_type, catalog),
                ),
            )
            for i, instance_name in enumerate(instance_names)
        ]

    def _outputs(self, args: GpuVmArgs, shapes: list[GpuShape]) -> dict[str, Any]:
        """The stack's outputs: what the tasks read to reach the VM (addresses, user, shape, nodes, costs)."""
        cfg, shape = args.config, args.shape
        external = [inst.network_interfaces[0].access_configs[0].nat_ip for inst in self.instances]
        internal = [inst.network_interfaces[0].network_ip for inst in self.instances]
        return {
            "instanceName": self.instance.name,
            "zone": self.instance.zone,
            "externalIp": external[0],
            "internalIp": internal[0],
            "sshUser": cfg.ssh_user,
            "machineType": shape.machine_type,
            "gpuType": shape.gpu_type,
            "gpuCount": shape.gpu_count,
            "spot": cfg.spot,
            "provisioning": provisioning.way(cfg),
            "maxRunHours": cfg.max_run_hours,
            "image": self.image,
            "hourlyCostUsd": args.hourly_cost_usd,
            "nodes": cfg.nodes,
            "nodeGpuCounts": [s.gpu_count for s in shapes],
            "nodeRoles": vm.node_roles(cfg),
            "instanceNames": [inst.name for inst in self.instances],
            "externalIps": external,
            "internalIps": internal,
            "dataDisks": [disk.name for disk in self.data_disks],
            "dataDiskMonthlyCostUsd": vm.data_disk_monthly_cost(cfg, args.catalog),
            "recoverHours": cfg.recover_hours if self.recovery is not None else 0,
        }

    def _boot_image(
        self, cfg: StackConfig, instance_name: str, newest: pulumi.Output[gcp.compute.GetImageResult]
    ) -> tuple[pulumi.Input[str], pulumi.Input[int]]:
        """The image ``instance_name`` boots and its checked boot disk size: the image its boot disk was
        created from where the instance exists already, else the family's newest (its first `up`)."""
        pinned = existing_boot_image(cfg, instance_name, self)
        if pinned is None:
            return newest.self_link, newest.disk_size_gb.apply(lambda gb: boot_disk_size(cfg, gb, f"the image family {cfg.image_family}"))
        project, image_name = image_project_and_name(pinned)
        image = gcp.compute.get_image(name=image_name, project=project, opts=pulumi.InvokeOptions(parent=self))
        return pinned, boot_disk_size(cfg, image.disk_size_gb, f"the image {image_name} that {instance_name} runs (pinned at its first up)")

    def _data_disk(self, name: str, cfg: StackConfig, node: int, disk_type: str) -> gcp.compute.Disk:
        """Node ``node``'s data disk (REMOTE_ROOT/runs). ``protect``: neither `pulumi destroy` nor a change
        that would replace it (zone, type) deletes it; `fab down` fetches its runs, then unprotects it."""
        one = cfg.nodes == 1
        return gcp.compute.Disk(
            f"{name}-data" if one else f"{name}-{node}-data",
            name=names.data_disk_name(cfg.stack, None if one else node),
            project=cfg.project,
            zone=cfg.zone,
            size=cfg.data_disk_size_gb,
            type=disk_type,
            labels={**vm.labels(cfg, pulumi.get_project()), "gpu-train-node": str(node)},
            description=f"gpu-train {cfg.stack}: runs and checkpoints of node {node}; outlives the VM; "
            "`fab down` fetches them before it lets the disk go",
            opts=pulumi.ResourceOptions(parent=self, protect=True),
        )
