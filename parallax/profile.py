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
- allreduce: Horovod's collectives (waiting for the slowest worker included);
- wait_for_chief: a worker other than the chief waiting for the step's token;
- compute: every other op of this worker.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
from typing import Dict, List, Optional, Set, Tuple

import tensorflow as tf
from tensorflow.python.client import timeline  # Chrome traces of RunMetadata; not exported

from parallax.analysis import GradientSources
from parallax.config import ProfileConfig

PHASES = ("input", "pull", "push", "server", "allreduce", "wait_for_chief", "compute")
# What TensorFlow's C++ profiler logs for each traced run (and, without a GPU, a warning that
# it collected no GPU trace); its log level is read once, when TensorFlow is loaded.
_PROFILER_LOG = re.compile(rb"profiler_session\.cc:\d+\] Profiler session |"
                           rb"xplane_to_step_stats\.cc:\d+\] GPU trace was not collected")
_INPUT_TYPES = {"IteratorGetNext", "IteratorGetNextSync", "QueueDequeueV2",
                "QueueDequeueManyV2", "QueueDequeueUpToV2", "ReaderReadV2"}


@contextlib.contextmanager
def profiler_log_dropped():
    """Standard error without the profiler's log lines of a run Parallax traces for itself (the
    driver's probe under AUTO), which a user did not ask for and may read as a problem; every
    other line written meanwhile is kept, in order, once the run is over."""
    try:
        saved = os.dup(2)
    except OSError:  # a process without standard error (a daemon's): nothing to keep clean
        yield
        return
    flush = sys.stderr.flush if sys.stderr is not None else (lambda: None)
    flush()
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = b"".join(line for line in captured if not _PROFILER_LOG.search(line))
            while kept:
                kept = kept[os.write(2, kept):]


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
        trace = timeline.Timeline(run_metadata.step_stats, graph=self._graph)
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


def op_spans(step_stats) -> Dict[str, Tuple[int, int]]:
    """{op name: (start, end)} in microseconds of a traced run, on every device."""
    spans: Dict[str, Tuple[int, int]] = {}
    for device in step_stats.dev_stats:
        for node in device.node_stats:
            start = node.all_start_micros
            first, last = spans.get(node.node_name, (start, start))
            spans[node.node_name] = (min(first, start),
                                     max(last, start + node.all_end_rel_micros))
    return spans


def step_shares(step_stats, sources: GradientSources, updates: Dict[str, Set[str]]
                ) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Of one worker's traced step, per variable: the share of the step done when its
    gradient is ready, the end of the last of its gradients' `sources` that ran (1.0 if none
    ran; cost.VariableStats.ready); and its share of the step's updates, `updates` its
    update's ops (cost.VariableStats.update). Updates run side by side: the time some update
    ran is shared among the variables in proportion to the time each one's own ran."""
    spans = op_spans(step_stats)
    begin = min(start for start, _ in spans.values())
    length = max(max(end for _, end in spans.values()) - begin, 1)
    ready = {variable: 1.0 if end is None else (end - begin) / length for variable, end in
             sources.latest({name: end for name, (_, end) in spans.items()}).items()}
    own = {variable: covered([spans[name] for name in names if name in spans])
           for variable, names in updates.items()}
    union = covered([spans[name] for names in updates.values() for name in names
                     if name in spans])
    update = {variable: seconds / max(sum(own.values()), 1) * union / length
              for variable, seconds in own.items()}
    return ready, update


def _phase(device: str, node, graph: tf.Graph) -> Optional[str]:
    name = node.node_name.split(":")[0]
    if name in ("_SOURCE", "_SINK"):
        return None
    try:
        op = graph.get_operation_by_name(name)
    except KeyError:  # an op the runtime added: a transfer between devices, a copy
        op = None
    if op is not None and op.type.startswith("Horovod"):
        return "allreduce"
    if op is not None and op.name.startswith("parallax_sync/") and "wait_for_step" in op.name:
        return "wait_for_chief"
    if op is not None and op.name.startswith("parallax_ps/") and op.type.startswith(
            "QueueEnqueue"):
        return "push"  # into a queue on a server (or this machine's, with local aggregation)
    if "/job:ps/" in device:
        if node.node_name == "RecvTensor" or (
                op is not None and op.name.startswith("parallax_ps/")
                and op.type.startswith("QueueDequeue")):
            return "push"
        return "server"
    if op is None:  # a worker receives from the servers only (its session's device filters)
        return "pull" if node.node_name == "RecvTensor" else "compute"
    if op.type in _INPUT_TYPES and not op.name.startswith("parallax_"):
        return "input"
    return "compute"


def covered(intervals: List[Tuple[int, int]]) -> int:
    """Microseconds covered by the union of the intervals."""
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total
