"""Config(profile_config=ProfileConfig(...)): a timeline of chosen runs on chosen workers.

For each profiled run the worker writes `worker{W}_step{S}.json`, a Chrome trace (open it in
chrome://tracing or ui.perfetto.dev) of every op on the worker and on the servers, and a line
of `phases.jsonl` saying how long the run spent in each phase: the time during which at least
one op of the phase was running, phases overlapping as the runtime overlaps them.

- input: reading this worker's batch (iterators, queue dequeues of the input pipeline);
- pull: values arriving at this worker from the servers (variables' rows, aggregates);
- push: gradients on their way to the servers: this worker's sent into the servers' queues,
  and the servers receiving the workers' and waiting on their queues for all of them (a
  server's receive lasts from its request until the tensor has arrived, so it also covers
  the sender's compute of it);
- server: the servers' own work, aggregation and updates;
- allreduce: the collectives, Horovod's or TensorFlow's (waiting for the slowest worker
  included; where TensorFlow's run apart from the steps, the step's wait for their results);
- wait_for_chief: a worker other than the chief waiting for the step's token;
- compute: every other op of this worker.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from parallax import tf_private
from parallax.collectives.tensorflow import APART_SCOPE
from parallax.config import ProfileConfig
from parallax.planning.traces import covered
from parallax.vocabulary import INPUT_OP_TYPES, QUEUE_DEQUEUE_OPS, READER_READ_OPS

PHASES = ("input", "pull", "push", "server", "allreduce", "wait_for_chief", "compute")
_INPUT_TYPES = INPUT_OP_TYPES | READER_READ_OPS


class Profiler:
    """Decides which of this worker's runs to trace, and writes what a traced run recorded."""

    def __init__(self, config: Optional[ProfileConfig], worker_id: int, graph: tf.Graph):
        self._steps = set(config.profile_steps) if config is not None and (
            worker_id in config.profile_workers) else set()
        self._dir = config.profile_dir if config is not None else None
        self._worker = worker_id
        self._graph = graph
        self._runs = 0

    def next_run(self, options, run_metadata) -> Tuple[object, object, bool]:
        """The options and metadata of the next run: a full trace when it is profiled (then
        also returned True), the caller's own otherwise."""
        self._runs += 1
        if self._runs not in self._steps:
            return options, run_metadata, False
        traced = tf.compat.v1.RunOptions()
        if options is not None:
            traced.CopyFrom(options)
        traced.trace_level = tf.compat.v1.RunOptions.FULL_TRACE
        if run_metadata is None:
            run_metadata = tf.compat.v1.RunMetadata()
        return traced, run_metadata, True

    def write(self, run_metadata, run_seconds: float) -> None:
        os.makedirs(self._dir, exist_ok=True)
        name = f"worker{self._worker}_step{self._runs}"
        trace = tf_private.timeline.Timeline(run_metadata.step_stats, graph=self._graph)
        with open(os.path.join(self._dir, name + ".json"), "w") as out:
            out.write(trace.generate_chrome_trace_format())
        phases = phase_seconds(run_metadata.step_stats, self._graph)
        record = {"worker": self._worker, "step": self._runs, "run_ms": 1000 * run_seconds,
                  **{f"{phase}_ms": round(1000 * seconds, 3)
                     for phase, seconds in phases.items()}}
        with open(os.path.join(self._dir, "phases.jsonl"), "a") as out:
            out.write(json.dumps(record) + "\n")


def phase_seconds(step_stats, graph: tf.Graph) -> Dict[str, float]:
    """Per phase, the seconds during which at least one of its ops ran."""
    spans: Dict[str, List[Tuple[int, int]]] = {phase: [] for phase in PHASES}
    for device in step_stats.dev_stats:
        for node in device.node_stats:
            phase = _phase(device.device, node, graph)
            if phase is not None:
                start = node.all_start_micros
                spans[phase].append((start, start + max(node.all_end_rel_micros, 1)))
    return {phase: covered(intervals) / 1e6 for phase, intervals in spans.items()}


def _phase(device: str, node, graph: tf.Graph) -> Optional[str]:
    name = node.node_name.split(":")[0]
    if name in ("_SOURCE", "_SINK"):
        return None
    try:
        op = graph.get_operation_by_name(name)
    except KeyError:  # an op the runtime added: a transfer between devices, a copy
        op = None
    if op is not None and (op.type.startswith(("Horovod", "Collective")) or (
            op.type in QUEUE_DEQUEUE_OPS and APART_SCOPE in op.name)):
        return "allreduce"
    if op is not None and op.name.startswith("parallax_sync/") and "wait_for_step" in op.name:
        return "wait_for_chief"
    if op is not None and op.name.startswith("parallax_ps/") and op.type.startswith(
            "QueueEnqueue"):
        return "push"  # into a queue on a server (or this machine's, with local aggregation)
    if "/job:ps/" in device:
        if node.node_name == "RecvTensor" or (
                op is not None and op.name.startswith("parallax_ps/")
                and op.type in QUEUE_DEQUEUE_OPS):
            return "push"
        return "server"
    if op is None:  # a worker receives from the servers only (its session's device filters)
        return "pull" if node.node_name == "RecvTensor" else "compute"
    if op.type in _INPUT_TYPES and not op.name.startswith("parallax_"):
        return "input"
    return "compute"


