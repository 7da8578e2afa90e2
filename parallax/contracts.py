"""Every hand-off between the job's processes: the environment the driver writes for each
process it starts, with one typed writer and one reader for each variable. A worker learns
from it its role, the cluster and its identity in it, the plan, and the shards the plan gives
parallax.get_partitioner's calls (read while the script builds its graph, before get_runner).
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

from parallax.cluster import Cluster
from parallax.errors import ParallaxError

ROLE_ENV = "PARALLAX_ROLE"  # "worker" or "server"; a process without it is a driver
CLUSTER_ENV = "PARALLAX_CLUSTER"  # Cluster.to_env(): the topology, addresses and worker id
SERVER_INDEX_ENV = "PARALLAX_SERVER_INDEX"  # which server a "server" process is
PLAN_ENV = "PARALLAX_PLAN"  # planning.plan.Plan.to_text(), made once by the driver
PARTITIONS_ENV = "PARALLAX_PARTITIONS"  # {call: shards} for parallax.get_partitioner's calls


def role() -> str:
    return os.environ.get(ROLE_ENV, "driver")


def process_env(role_name: str, cluster: Cluster) -> Dict[str, str]:
    return {ROLE_ENV: role_name, CLUSTER_ENV: cluster.to_env()}


def read_cluster() -> Cluster:
    return Cluster.from_json(os.environ[CLUSTER_ENV])


def server_env(index: int) -> Dict[str, str]:
    return {SERVER_INDEX_ENV: str(index)}


def read_server_index() -> int:
    return int(os.environ[SERVER_INDEX_ENV])


def plan_env(plan_text: str, partitions: List[list]) -> Dict[str, str]:
    """The plan, and apart from it the partitioner's counts (`partitions`: [call, variable,
    shards] each), which the script's graph code reads without decoding the plan."""
    return {PLAN_ENV: plan_text,
            PARTITIONS_ENV: json.dumps({str(call): count for call, _, count in partitions})}


def read_plan_text() -> str:
    if PLAN_ENV not in os.environ:
        raise ParallaxError("this worker has no plan from the driver; start the script itself "
                            "(python script.py), whose get_runner plans and launches the workers")
    return os.environ[PLAN_ENV]


def read_partition_counts() -> Dict[int, int]:
    """{call: shards} of the driver's plan; empty outside a job, or in the driver."""
    text: Optional[str] = os.environ.get(PARTITIONS_ENV)
    return {int(call): count for call, count in json.loads(text).items()} if text else {}
