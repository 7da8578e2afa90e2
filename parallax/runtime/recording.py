"""The two runs of a script that `python -m parallax.verify` compares (contracts.VerifyRun).

Distributed, each worker's runner has a `Recorder`: the chief writes every variable before the
first training step (what one device starts from); each worker writes what each of its first N
training steps read (its tf.data and queue batches and fed data, as input_check finds them);
after the Nth step every worker writes its variables and the process exits.

On one device, get_runner returns a `ReplayRunner`: a session of the script's graph as written,
driven by the script's own loop. Its training steps start from the chief's values and read,
instead of their own input, the N workers' inputs of the same step joined along the batch axis:
one device on the combined batch. After the Nth step it writes its variables and exits.

Files in the folder: initial.npz, workerK/stepI.npz, workerK/final.npz, one_device.npz,
notes.txt when it padded the workers' inputs to join them, and problem.txt when the one-device
run cannot take the workers' steps (verify reports why).
"""
from __future__ import annotations

import glob
import os
from typing import Dict, List

import numpy as np
import tensorflow as tf

from parallax import contracts, tf_private
from parallax.contracts import VerifyRun
from parallax.planning.analysis import GraphAnalysis
from parallax.runtime import fetches as fetches_structure
from parallax.runtime import input_check
from parallax.vocabulary import (STATEFUL_RANDOM_OP_TYPES, load_values, reached,
                                 slots_of, start_queue_runners)

# Random draws of a step: recorded where one value is drawn for each example (dropout's mask,
# an augmentation's flip), so that one device draws the workers' values for the combined batch.
DRAW_OP_TYPES = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "StatelessRandomUniformV2", "StatelessRandomNormalV2", "StatelessTruncatedNormalV2"})
# The other draws are not one per example (a sampled softmax's candidates for the whole batch,
# a shuffle), and Python inside the graph has input that cannot be recorded: not comparable.
UNCOMPARABLE_OP_TYPES = (STATEFUL_RANDOM_OP_TYPES - DRAW_OP_TYPES) | frozenset({
    "LogUniformCandidateSampler", "UniformCandidateSampler", "FixedUnigramCandidateSampler",
    "LearnedUnigramCandidateSampler", "ThreadUnsafeUnigramCandidateSampler",
    "AllCandidateSampler", "PyFunc", "PyFuncStateless", "EagerPyFunc"})
ONE_DEVICE_EXIT = 3  # the one-device run stopped at a problem (problem.txt)
NOTES = "notes.txt"  # what the one-device run did to join the workers' inputs, for the report


def variables(graph: tf.Graph) -> List[tf.Variable]:
    """Every variable of the script's graph: slots, moving averages and metrics' too."""
    return (graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
            + graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES))


def variable_values(graph: tf.Graph, run) -> Dict[str, np.ndarray]:
    """Every variable of `graph` by name, read with `run` (a session's or a runner's)."""
    found = variables(graph)
    return dict(zip([v.op.name for v in found], run(found)))


def final_values(graph: tf.Graph, run) -> Dict[str, np.ndarray]:
    """variable_values after the last step, a dynamic embedding's by id: its variable and
    slots (the variables colocated with it, of as many rows) as the rows of its ids in the
    order of the ids, which '<table>/keys' holds. Which row an id has differs from one device
    to a job of servers; its values do not."""
    values = variable_values(graph, run)
    for table in contracts.read_tables(graph):
        keys, rows = run([graph.get_tensor_by_name(name) for name in table.exported])
        order = np.argsort(keys, kind="stable")
        for name in [table.variable] + [v.op.name for v in slots_of(graph, table.variable)]:
            values[name] = values[name][rows[order]]
        values[f"{table.name}/keys"] = keys[order]
    return values


def _save(path: str, values: Dict[str, np.ndarray]) -> None:
    """Writes `values` to an .npz; tf.string values (object arrays of bytes) as their bytes and
    lengths, so that `load` needs no pickle."""
    arrays = {}
    for name, value in values.items():
        value = np.asarray(value)
        if value.dtype == object:
            arrays[f"{name} lengths"] = np.array([len(b) for b in value.flat],
                                                 np.int64).reshape(value.shape)
            arrays[f"{name} bytes"] = np.frombuffer(b"".join(value.flat), np.uint8)
        else:
            arrays[name] = value
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez(path + ".tmp.npz", **arrays)
    os.replace(path + ".tmp.npz", path)


def load(path: str) -> Dict[str, np.ndarray]:
    """What `_save` wrote, by name."""
    with np.load(path) as stored:
        arrays = {name: stored[name] for name in stored.files}
    values = {name: value for name, value in arrays.items() if " " not in name}
    for key in arrays:
        name, _, part = key.rpartition(" ")
        if part == "lengths":
            lengths, data = arrays[key], arrays[f"{name} bytes"].tobytes()
            ends = np.cumsum(lengths.ravel())
            values[name] = np.array([data[end - n:end] for n, end in zip(lengths.flat, ends)],
                                    dtype=object).reshape(lengths.shape)
    return values


class Recorder:
    """A worker's side of the distributed run."""

    def __init__(self, run: VerifyRun, worker_id: int):
        self.run = run
        self.steps = 0  # training steps recorded
        self._folder = os.path.join(run.folder, f"worker{worker_id}")
        self._chief = worker_id == 0

    @property
    def active(self) -> bool:
        return self.steps < self.run.steps

    @property
    def needs_initial(self) -> bool:
        return self._chief and self.steps == 0

    def write_initial(self, values: Dict[str, np.ndarray]) -> None:
        _save(os.path.join(self.run.folder, "initial.npz"), values)

    def write_step(self, inputs: Dict[str, np.ndarray]) -> bool:
        """Records a training step's inputs; whether it was the last one to record."""
        self.steps += 1
        _save(os.path.join(self._folder, f"step{self.steps}.npz"), inputs)
        return self.steps == self.run.steps

    def finish(self, values: Dict[str, np.ndarray]) -> None:
        _save(os.path.join(self._folder, "final.npz"), values)
        raise SystemExit(0)


def step_draws(ops, fed) -> List[tf.Tensor]:
    """The random draws a run of `ops` makes that can be recorded (fetched: not inside a
    loop or a cond)."""
    return sorted((op.outputs[0] for op in reached(ops, fed)
                   if op.type in DRAW_OP_TYPES
                   and tf_private.control_flow_context(op) is None),
                  key=lambda t: t.name)


# Ops that keep each row of an input of theirs (of the same rank) a row of their output.
_ROW_WISE_OP_TYPES = frozenset({
    "Identity", "MatMul", "BiasAdd", "Add", "AddV2", "Sub", "Mul", "RealDiv", "Maximum",
    "Minimum", "Relu", "Relu6", "Elu", "Selu", "Gelu", "Tanh", "Sigmoid", "Erf", "Exp", "Log",
    "Neg", "Square", "Sqrt", "Rsqrt", "Pow", "Softmax", "Cast", "SquaredDifference",
    "GreaterEqual", "Greater", "Less", "LessEqual", "SelectV2", "Select"})
_ROW_WALK_LIMIT = 64  # ops walked back from a draw's tensor before giving up


def examples_in_blocks(draw: tf.Tensor, rows_per_example: int) -> bool:
    """Whether `draw`'s rows are each example's `rows_per_example` rows in a block: the tensor
    it is drawn for (whose shape it takes, or which its values mask, as dropout's do) is
    computed row by row from a reshape that merged an example's leading dimensions into rows
    ([batch, sequence, ...] to [batch x sequence, ...])."""
    shape = draw.op.inputs[0] if draw.op.inputs else None
    drawn_for = [shape.op.inputs[0]] if shape is not None and shape.op.type == "Shape" else []
    frontier = [draw]
    for _ in range(3):  # the mask's comparison, its cast, the product
        following = [op for tensor in frontier for op in tensor.consumers()
                     if op.type in _ROW_WISE_OP_TYPES]
        drawn_for += [t for op in following for t in op.inputs
                      if t not in frontier and t.shape.rank == draw.shape.rank]
        frontier = [t for op in following for t in op.outputs]
    return any(_rows_merged_from_examples(t, rows_per_example) for t in drawn_for)


def _rows_merged_from_examples(tensor: tf.Tensor, rows_per_example: int) -> bool:
    for _ in range(_ROW_WALK_LIMIT):
        op = tensor.op
        if op.type == "Reshape":
            sizes = op.inputs[0].shape.as_list() if op.inputs[0].shape.rank else []
            products = np.cumprod([size or 0 for size in sizes[1:]])
            return rows_per_example in products.tolist()
        if op.type not in _ROW_WISE_OP_TYPES:
            return False
        same_rows = [t for t in op.inputs
                     if t.shape.rank == tensor.shape.rank and t.shape[:1] == tensor.shape[:1]]
        if not same_rows:
            return False
        tensor = same_rows[0]
    return False


def worker_folders(folder: str) -> List[str]:
    return sorted(glob.glob(os.path.join(folder, "worker*")),
                  key=lambda path: int(os.path.basename(path)[len("worker"):]))


class ReplayRunner(tf_private.SessionInterface):
    """The one-device side: what get_runner returns in verify's one-device run."""

    def __init__(self, graph: tf.Graph, analysis: GraphAnalysis, run: VerifyRun):
        self.run_settings = run
        self._graph = graph
        self.num_workers = run.workers
        self.worker_id = 0
        self.is_chief = True
        for op in graph.get_operations():
            if op.device.startswith("/job:"):  # a parameter-server job's pins: one device
                tf_private.set_device(op, "")
        self.session = tf.compat.v1.Session(graph=graph, config=tf.compat.v1.ConfigProto(
            allow_soft_placement=True))
        self.session.run([v.initializer for v in variables(graph)]
                         + graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS))
        self._writes = {graph.get_operation_by_name(name) for name in analysis.training_writes}
        self._workers = worker_folders(run.folder)
        self._steps = 0
        self._paddings = {}  # input name: (padding value, what it is), once padded; in NOTES
        self._coordinator = tf.compat.v1.train.Coordinator()
        self._threads = start_queue_runners(graph, self.session, self._coordinator)

    @property
    def graph(self) -> tf.Graph:
        return self._graph

    @property
    def sess_str(self) -> str:
        return self.session.sess_str

    def as_default(self):
        return tf_private.default_session(self)

    def describe(self) -> str:
        return "parallax verify: one device on the workers' combined batches"

    def partial_run_setup(self, fetches, feeds=None):
        raise NotImplementedError("partial runs")

    def partial_run(self, handle, fetches, feed_dict=None):
        raise NotImplementedError("partial runs")

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None, report=None):
        feeds = dict(feed_dict or {})
        leaves, _ = fetches_structure.flatten(fetches)
        ops = [self._op(leaf) for leaf in leaves]
        fed = {self.graph.as_graph_element(key) for key in feeds}
        runs = reached(ops, fed)
        if self._steps < self.run_settings.steps and runs & self._writes:
            self._steps += 1
            records = [load(os.path.join(folder, f"step{self._steps}.npz"))
                       for folder in self._workers]
            if self._steps == 1:
                self._start(runs, set(records[0]))
            combined = self._combined_inputs(records)
            feeds = {key: value for key, value in feeds.items()
                     if self.graph.as_graph_element(key) not in combined}
            feeds.update(combined)
            try:
                result = self.session.run(fetches, feeds, options, run_metadata)
            except (ValueError, tf.errors.InvalidArgumentError) as error:
                self._stop(f"one device cannot take the {self.num_workers} workers' batches "
                           f"of step {self._steps} joined: {str(error).splitlines()[0]}")
            if self._steps == self.run_settings.steps:
                _save(self.run_settings.one_device_file,
                      final_values(self.graph, self.session.run))
                raise SystemExit(0)
            return result
        return self.session.run(fetches, feeds, options, run_metadata)

    def close(self) -> None:
        self._coordinator.request_stop()
        self._coordinator.join(self._threads, stop_grace_period_secs=10)
        self.session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _op(self, leaf) -> tf.Operation:
        element = self.graph.as_graph_element(leaf, allow_tensor=True, allow_operation=True)
        return getattr(element, "op", element)

    def _start(self, runs, recorded) -> None:
        """Before the first training step (whose `recorded` inputs are named): what makes it
        incomparable, then the chief's values."""
        drawn = sorted(op.name for op in runs if op.type in DRAW_OP_TYPES
                       and op.outputs[0].name not in recorded)
        if drawn:
            self._stop(f"the step draws random numbers inside a loop or a cond ({drawn[0]!r}), "
                       "which verify cannot record: each worker draws its own, one device "
                       "would draw others")
        other = sorted((op.type, op.name) for op in runs if op.type in UNCOMPARABLE_OP_TYPES)
        if other:
            why = ("runs Python inside the graph, whose input verify cannot record" if "Py" in
                   other[0][0] else "draws random numbers that are not one per example: "
                   "each worker draws its own set, one device one set for the combined batch")
            self._stop(f"the step {why} ({other[0][1]!r}, {other[0][0]})")
        initial = load(os.path.join(self.run_settings.folder, "initial.npz"))
        found = variables(self.graph)
        load_values(self.session, found, [initial[v.op.name] for v in found])

    def _combined_inputs(self, steps) -> Dict[tf.Tensor, np.ndarray]:
        """The step's recorded inputs of every worker (`steps`, each worker's record), joined
        along the batch axis."""
        if not steps[0]:
            self._stop("the step reads no input verify can record: it records a step's "
                       "input where it enters the graph (tf.data iterators, input queues, "
                       "feed_dict), and this one reads none of them")
        combined = {}
        data = [name for name in steps[0]
                if self.graph.get_tensor_by_name(name).op.type not in DRAW_OP_TYPES]
        batches = [len(step[data[0]]) for step in steps] if data else []
        examples = sum(batches)
        for name in steps[0]:
            parts = [step[name] for step in steps]
            tensor = self.graph.get_tensor_by_name(name)
            if name not in data and data:
                self._check_per_example(tensor, parts, batches)
            joined = self._joined(tensor, parts, drawn=name not in data)
            if self.run_settings.reordered and examples:
                # rows in blocks of each example's (checked above): the examples reversed
                joined = joined.reshape(examples, -1, *joined.shape[1:])[::-1].reshape(
                    joined.shape)
            combined[tensor] = joined
        return combined

    def _check_per_example(self, draw: tf.Tensor, parts, batches) -> None:
        """A draw is joined as the workers' examples are when it has a row per example, or a
        block of rows per example (a reshape of [batch, sequence, ...] to [batch x
        sequence, ...] behind it, as dropout over a sequence's tokens flattened has)."""
        ratios = {len(part) / batch if np.ndim(part) else 0.0
                  for part, batch in zip(parts, batches)}
        ratio = ratios.pop() if len(ratios) == 1 else 0.0
        if ratio == 1 or (ratio > 1 and ratio.is_integer()
                          and examples_in_blocks(draw, int(ratio))):
            return
        self._stop(f"the step draws random numbers that are not one per example "
                   f"({draw.name!r}, shape {parts[0].shape}, for a batch of {batches[0]}): "
                   "each worker draws its own, one device would draw others for the combined "
                   "batch")

    def _joined(self, tensor: tf.Tensor, parts: List[np.ndarray], drawn: bool) -> np.ndarray:
        """The workers' `parts` of `tensor` along the batch axis. Batches padded each to its
        longest example (tf.data's padded_batch) are padded to the longest of all with the
        dataset's padding value, as one device pads the combined batch; draws for them with 0,
        a value one device could draw for positions that are padding."""
        shapes = {part.shape[1:] for part in parts}
        if len(shapes) == 1:
            return np.concatenate(parts)
        if len({len(shape) for shape in shapes}) != 1:
            self._stop(f"the workers' {tensor.name!r} of step {self._steps} cannot be joined "
                       f"along the batch axis (shapes {[p.shape for p in parts]})")
        longest = tuple(max(sizes) for sizes in zip(*shapes))
        first = tensor.name not in self._paddings
        if first:
            self._paddings[tensor.name] = self._padding(tensor, parts, drawn)
        value, source = self._paddings[tensor.name]
        joined = np.concatenate([np.pad(part, [(0, 0)] + [
            (0, size - have) for size, have in zip(longest, part.shape[1:])],
            constant_values=value) for part in parts])
        if first:
            with open(os.path.join(self.run_settings.folder, NOTES), "a") as out:
                out.write(f"the workers' {tensor.name!r} of step {self._steps} padded to "
                          f"{joined.shape} with {source}\n")
        return joined

    def _padding(self, tensor: tf.Tensor, parts: List[np.ndarray], drawn: bool):
        """What `tensor`'s parts are padded with, and what that value is (for NOTES)."""
        if drawn:
            return 0, "0 where they are padding, a value one device could draw"
        value, source = input_check.padding_value(tensor)
        if source is None:
            self._stop(f"the workers' {tensor.name!r} of step {self._steps} cannot be "
                       f"joined along the batch axis (shapes {[p.shape for p in parts]}): "
                       "they are not padded by a tf.data padded_batch that verify can find "
                       "(one before the iterator, with a constant padding value)")
        value = value.item()
        return value, (f"{value!r}, the padding value of {source!r}, as one device pads the "
                       "combined batch")

    def _stop(self, problem: str) -> None:
        with open(os.path.join(self.run_settings.folder, "problem.txt"), "w") as out:
            out.write(problem)
        raise SystemExit(ONE_DEVICE_EXIT)
