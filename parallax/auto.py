"""run_option='AUTO': before launching, the driver measures how many rows each sparse gradient
has on the first batches of the input (a probe session of the graph as written), and the cost
model (parallax/cost.py) picks how each variable is synchronized. The decision reaches every
process of the job in its environment, so that all of them build the same plan.

The probe reads the input the graph reads itself (tf.data, as `parallax.shard` expects); a
graph fed through feed_dict cannot be measured before it runs, and gets HYBRID's rule.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from parallax import cost
from parallax.analysis import GraphAnalysis
from parallax.errors import ParallaxError
from parallax.passes import row_sums

AUTO_ENV = "PARALLAX_AUTO"


@dataclasses.dataclass
class Decision:
    methods: Dict[str, dict]  # variable -> {"how": cost.ALLREDUCE/ALLGATHER/PS, "server": int}
    stats: Dict[str, dict]  # variable -> cost.VariableStats fields, as measured
    note: str  # how it was decided

    def to_env(self) -> Dict[str, str]:
        return {AUTO_ENV: json.dumps(dataclasses.asdict(self))}

    @classmethod
    def from_env(cls) -> "Decision":
        if AUTO_ENV not in os.environ:
            raise ParallaxError("run_option='AUTO': this worker has no decision from the "
                                "driver; start the script itself (python script.py), whose "
                                "get_runner measures and launches the workers")
        return cls(**json.loads(os.environ[AUTO_ENV]))

    def variable_stats(self) -> Dict[str, cost.VariableStats]:
        return {name: cost.VariableStats(**{**fields, "unique": tuple(fields["unique"])})
                for name, fields in self.stats.items()}


def decide(graph: tf.Graph, analysis: GraphAnalysis, workers_per_machine: List[int],
           links: Optional[cost.Links] = None) -> Decision:
    """`links`: as measured between two machines (runner.link_probe); None: assumed."""
    shape = cost.Cluster(len(workers_per_machine), max(workers_per_machine))
    measured = links is not None
    links = links or cost.Links()
    stats, problem = measure(graph, analysis, shape.workers)
    if problem:
        methods = {v.name: {"how": cost.PS if v.is_sparse else cost.ALLREDUCE, "server": None}
                   for v in analysis.variables.values()}
        return Decision(methods, {}, f"HYBRID's rule: {problem}")
    summable = {v.name for v in analysis.sparse if all(
        row_sums.rows_can_be_summed(graph.get_tensor_by_name(r.values),
                                    graph.get_tensor_by_name(r.indices))
        for r in v.gradients if r.is_sparse)}
    chosen = cost.choose(list(stats.values()), shape, links, summable=summable)
    methods = {name: {"how": method.how, "server": method.servers[0] if method.servers
                      else None} for name, method in chosen.items()}
    note = (f"cost model: {shape.machines} machines x {shape.workers_per_machine} workers, "
            f"links {'measured' if measured else 'assumed'}: "
            f"{links.bandwidth * 8 / 1e6:.4g} Mbit/s, {links.latency * 1e6:.3g} us")
    return Decision(methods, {n: dataclasses.asdict(s) for n, s in stats.items()}, note)


def measure(graph: tf.Graph, analysis: GraphAnalysis,
            batches: int) -> Tuple[Dict[str, cost.VariableStats], Optional[str]]:
    """Each variable's statistics; for a sparse one the ids its gradients carry in `batches`
    consecutive batches (as many as the job's workers take in one step). Or why it cannot."""
    sparse = {v.name: [graph.get_tensor_by_name(r.indices) for r in v.gradients if r.is_sparse]
              for v in analysis.sparse}
    ids: Dict[str, List[np.ndarray]] = {name: [] for name in sparse}
    if sparse:
        config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            try:
                for _ in range(batches):
                    for name, values in session.run(sparse).items():
                        ids[name].append(np.concatenate([v.ravel() for v in values]))
            except tf.errors.InvalidArgumentError as error:
                return {}, f"the input could not be read before the job ({error.message})"
            except tf.errors.OpError as error:
                return {}, f"the probe of the input failed: {error.message.splitlines()[0]}"
    stats = {}
    for info in analysis.variables.values():
        if info.name not in ids:
            stats[info.name] = cost.VariableStats(info.name, info.nbytes)
            continue
        batches_ids = ids[info.name]
        seen, unique = set(), []
        for batch in batches_ids:
            seen.update(batch.tolist())
            unique.append(len(seen))
        row_bytes = info.nbytes // max(info.shape[0], 1)
        stats[info.name] = cost.VariableStats(
            info.name, info.nbytes, rows=int(np.mean([len(b) for b in batches_ids])),
            row_bytes=row_bytes, index_bytes=sparse[info.name][0].dtype.size,
            unique=tuple(unique))
    return stats, None
