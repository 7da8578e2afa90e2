"""What a plan puts in each server's memory, against PSConfig.server_memory_bytes, and a
dynamic embedding's checkpoint against the table it would restore into: both refused by the
driver, naming the table (and the server), before any process starts; never a server killed
for its memory, nor a job stopped at its restore."""
from __future__ import annotations

import collections
from typing import Dict, Optional

import tensorflow as tf

from parallax import contracts
from parallax.errors import ParallaxError
from parallax.planning.job_plan import Plan
from parallax.planning.problem import whole_name
from parallax.vocabulary import slots_of


def held_bytes(graph: tf.Graph, plan: Plan) -> Dict[int, Dict[str, int]]:
    """Each server's bytes, by the variable (its whole name) they are of: the variable's rows
    there with its optimizer slots' (the variables colocated with it of as many rows)."""
    held: Dict[int, Dict[str, int]] = collections.defaultdict(dict)
    for name, variable_plan in plan.variables.items():
        if variable_plan.server is None:
            continue
        whole = whole_name(name)
        slots = len(slots_of(graph, whole))
        held[variable_plan.server][whole] = held[variable_plan.server].get(whole, 0) + (
            variable_plan.variable.nbytes * (1 + slots))
    return held


def check_server_memory(graph: tf.Graph, plan: Plan, limit: Optional[int]) -> None:
    """Raise where a server would hold more than `limit` bytes (None: no limit)."""
    if limit is None:
        return
    tables = {record.variable: record for record in contracts.read_tables(graph)}
    for server, variables in sorted(held_bytes(graph, plan).items()):
        total = sum(variables.values())
        if total <= limit:
            continue
        largest = max(variables, key=variables.get)
        what = (f"dynamic embedding '{tables[largest].name}': its part on server {server} "
                f"(capacity {tables[largest].capacity}, dim {tables[largest].dim}, with its "
                "slots)" if largest in tables else f"server {server}: {largest!r}")
        raise ParallaxError(
            f"{what} and the other variables there would hold {total} bytes, more than "
            f"PSConfig(server_memory_bytes={limit}); give the table less capacity, or the job "
            "more machines (each has a server)")


def check_checkpoint(graph: tf.Graph, checkpoint: Optional[str]) -> None:
    """Raise where `checkpoint` (the one a job would resume from) holds a dynamic embedding
    of another dim, or more ids than the table has rows."""
    if checkpoint is None:
        return
    shapes = dict(tf.train.list_variables(checkpoint))
    for table in contracts.read_tables(graph):
        saved = shapes.get(table.variable)
        if saved is None:
            continue
        if saved[1:] != [table.dim]:
            raise ParallaxError(
                f"dynamic embedding '{table.name}': the checkpoint {checkpoint} holds rows of "
                f"{saved[1:]}, the table's are of dim {table.dim}")
        ids = shapes.get(f"{table.name}/keys-keys", [0])[0]
        if ids > table.capacity or saved[0] != table.capacity:
            raise ParallaxError(
                f"dynamic embedding '{table.name}': the checkpoint {checkpoint} holds "
                f"{ids} ids in a table of capacity {saved[0]}, the table's capacity is "
                f"{table.capacity}; build the table with capacity={saved[0]}")

