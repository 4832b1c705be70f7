"""What a job needs to join its cluster: torch's variables, TensorFlow's TF_CONFIG and Vertex AI's
CLUSTER_SPEC, from the node's place in the cluster (JobSpec.node). Standard library only."""

from __future__ import annotations

import json
from typing import Any

from gpu_train.contract import node_roles

POOLS = {"chief": "workerpool0", "worker": "workerpool1", "ps": "workerpool2"}  # Vertex's pools by position


def cluster_env(node: dict[str, Any], nproc: int) -> dict[str, str]:
    """What a --command job needs to join its cluster: torch's variables and TensorFlow's TF_CONFIG.

    TF_CONFIG follows AI Platform's clusters: node 0 is the chief, then workers, and with ``ps``
    the last nodes are parameter servers. CLUSTER_SPEC says the same as Vertex AI does (its ``job`` key,
    the CustomJob's own JSON, is left out: there is no CustomJob here).
    """
    nnodes, rank = int(node.get("nnodes", 1)), int(node.get("rank", 0))
    hosts = node.get("hosts") or [node.get("masterAddr", "localhost")]
    tf_port, ps = int(node.get("tfPort", 2222)), int(node.get("ps", 0))
    addresses = [f"{h}:{tf_port}" for h in hosts]
    roles = node_roles(nnodes, ps)
    cluster = {"chief": addresses[:1]}
    if nnodes - 1 - ps:
        cluster["worker"] = addresses[1 : nnodes - ps]
    if ps:
        cluster["ps"] = addresses[nnodes - ps :]
    index = rank if roles[rank] == "chief" else rank - 1 if roles[rank] == "worker" else rank - (nnodes - ps)
    pools = {POOLS[role]: addresses for role, addresses in cluster.items()}
    return {
        "MASTER_ADDR": str(node.get("masterAddr", "localhost")),
        "MASTER_PORT": str(node.get("masterPort", 29500)),
        "NODE_RANK": str(rank),
        "NNODES": str(nnodes),
        "NPROC_PER_NODE": str(nproc),
        "WORLD_SIZE": str(nnodes * nproc),
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": roles[rank], "index": index}}),
        # Vertex AI's own (its pools by position: workerpool0 the chief, 1 the workers, 2 parameter servers)
        "CLUSTER_SPEC": json.dumps({"cluster": pools, "environment": "cloud", "task": {"type": POOLS[roles[rank]], "index": index}}),
    }
