"""Session wrapper: runs the transformed graph, taking the user's fetches and feeds as they
were written against the original graph (objects or names, nested as Session.run takes them)."""
from __future__ import annotations

import functools
import inspect
import logging
import os
import sysconfig
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from parallax import contracts, tf_private
from parallax.errors import ParallaxError
from parallax.rewriting.graph_map import GraphMap
from parallax.runtime import fetches as fetches_structure
from parallax.runtime import input_check, input_position, recording, stages
from parallax.runtime.stages import fed_path
from parallax.runtime.steps import Steps
from parallax.vocabulary import initializer_op, start_queue_runners

log = logging.getLogger("parallax")


# Where the script's own frames are not: an op's traceback, innermost last, ends in these.
_LIBRARIES = tuple(sysconfig.get_paths()[key] + os.sep for key in ("purelib", "platlib")) + (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)


def _made_at(op: tf.Operation) -> str:
    """An initializer, named by the script's line that made it rather than by its name, which
    differs between workers where the chief's graph holds more ops of that name (init_3 on the
    chief, init_1 on the others)."""
    for frame in reversed(op.traceback or []):  # none in a graph imported
        if not os.path.abspath(frame.filename).startswith(_LIBRARIES):
            return f"the initializer made at {frame.filename}:{frame.lineno}"
    return op.name


class ParallaxRunner(tf_private.SessionInterface):
    """What `parallax.get_runner` returns in each worker process. It stands for a session
    where TensorFlow takes one: `saver.save(runner, path)` (the chief writes the files, other
    workers only return the path), `saver.restore(runner, path)`, and `tensor.eval()` or
    `op.run()` inside `with runner.as_default():`."""

    def __init__(self, graphs: GraphMap, session: tf.compat.v1.Session, num_workers: int,
                 worker_id: int, description: str, checkpointer=None, training_writes=(),
                 heartbeat=None, synchronization=None, profiler=None, check_input=False,
                 recorder=None):
        self._graphs = graphs
        graph = graphs.copy
        self.session = session
        self.num_workers = num_workers
        self.worker_id = worker_id
        self._description = description
        # variable name -> 'allreduce', 'allgather' or 'parameter server'
        self.synchronization = dict(synchronization or {})
        self._aggregated = contracts.read_aggregated(graph)
        # In a worker other than the chief, a fetched server-side update is its cut: the wait
        # for the chief to apply it.
        self._cuts = {write: graph.get_operation_by_name(cut)
                      for write, cut in contracts.read_server_writes(graph).items() if cut}
        self._steps = Steps(graph, self.is_chief, training_writes)
        self.last_run = (False, 0.0)  # whether the last run was a training step, its seconds
        self._initializers = _initializer_names(graph)
        self._local_initializers = _local_initializer_names(graph)
        self._skipped_initializers: Dict[str, tf.Operation] = {}
        self._checkpoints = stages.Checkpoints(session, checkpointer)
        self._stages = self._make_stages(heartbeat, profiler, recorder,
                                         check_input and heartbeat is not None
                                         and num_workers > 1)
        # A queue-based input pipeline (tf.compat.v1.train.shuffle_batch, string_input_producer)
        # runs as under tf.compat.v1.train.MonitoredSession: started here, stopped at close.
        self._coordinator = tf.compat.v1.train.Coordinator()
        self._queue_threads = start_queue_runners(graph, session, self._coordinator)
        # And the loops of collectives run apart from the steps (collectives/tensorflow.py).
        for loop in contracts.read_apart_loops(graph):
            self._queue_threads += loop.create_threads(session, self._coordinator)

    @property
    def graph(self) -> tf.Graph:
        """The graph given to get_runner, as it was built: single-device, for a FileWriter or
        a Saver's meta graph. Ops built in it later run too."""
        return self._graphs.user

    @property
    def transformed_graph(self) -> tf.Graph:
        """The graph this worker runs: a copy of the user's, rewritten by Parallax."""
        return self._graphs.copy

    @property
    def sess_str(self) -> str:
        return self.session.sess_str

    @property
    def is_chief(self) -> bool:
        return self.worker_id == 0

    def as_default(self):
        """A context in which this runner is the default session: `tensor.eval()`,
        `op.run()`, and the TensorFlow functions that take the default session."""
        return tf_private.default_session(self)

    def partial_run_setup(self, fetches, feeds=None):
        raise ParallaxError("partial runs are not supported by Parallax's runner: a step is "
                            "one runner.run")

    def partial_run(self, handle, fetches, feed_dict=None):
        self.partial_run_setup(fetches)

    def describe(self) -> str:
        """One line per variable: kind, shape, bytes, where it lives, how it is synchronized."""
        return self._description

    def _make_stages(self, heartbeat, profiler, recorder, check_input: bool
                     ) -> List[stages.Stage]:
        """The stages of this worker's runs, in their order (stages.py)."""
        inputs = stages.StepInputs(self.graph)
        made = []
        if recorder is not None:
            made.append(stages.Recording(
                recorder, inputs, lambda: recording.variable_values(self.graph, self.run),
                lambda: recording.final_values(self.graph, self.run)))
        if check_input:
            made.append(stages.InputDigests(heartbeat, inputs))
        sizes = contracts.read_table_sizes(self.session.graph)
        if sizes and heartbeat is not None and self.is_chief:
            made.append(stages.TableSizes({name: self.session.graph.get_tensor_by_name(tensor)
                                           for name, tensor in sizes.items()}))
        if profiler is not None:
            made.append(stages.Profiling(profiler))
        made.append(self._checkpoints)
        if heartbeat is not None:
            made.append(stages.Progress(heartbeat))
        return made

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None, report=None):
        """Session.run on the original graph's fetches and feeds. `report`: scalars to show
        in the driver's progress bar and metrics file, averaged over workers, e.g.
        {"loss": loss}; they are computed in the same run."""
        self.last_run = (False, 0.0)
        saving = _is_checkpoint_save(self._element_or_none(fetches))  # a Saver's, through us
        saved = fed_path(feed_dict) if saving else None
        if saved is not None and self._checkpoints.checkpointer is not None:
            self._checkpoints.checkpointer.save_input(self.session, saved)  # every worker
        if saving and not self.is_chief:  # the chief writes the checkpoint; the others would
            return list(feed_dict.values())[0] if feed_dict else None  # write the same files
        step, build = self._step(fetches, feed_dict, options, run_metadata, report, saved)
        for stage in self._stages:
            stage.before_run(step)
        try:
            self._run(step)
            for stage in self._stages:
                stage.after_run(step)
        finally:
            for stage in reversed(self._stages):
                stage.end_run(step)
        return build(step.values)

    def _step(self, fetches, feed_dict, options, run_metadata, report, saved):
        """The run in this worker's graph, and what makes its result of the fetches' values."""
        leaves, build = fetches_structure.flatten(fetches)
        mapped = [self._map_fetch(leaf) for leaf in leaves]
        reported = {name: self._map_fetch(value) for name, value in (report or {}).items()}
        feeds = None if feed_dict is None else {
            self._graphs.find(self._element(key, "feed key")): value
            for key, value in feed_dict.items()}
        step = stages.Step(mapped, reported, feeds, feed_dict, options=options,
                           run_metadata=run_metadata, saved=saved,
                           will_train=lambda: self._steps.is_training(
                               (mapped, reported, step.inputs), feeds))
        return step, build

    def _run(self, step: stages.Step) -> None:
        started = time.perf_counter()
        (step.values, scalar_values, input_values), step.training, step.restore = (
            self._steps.run(self.session, (step.fetches, step.reported, step.inputs), step.feeds,
                            step.options, step.run_metadata))
        step.seconds = time.perf_counter() - started
        self.last_run = (step.training, step.seconds)
        if step.training and step.inputs:
            step.named_inputs = self._named_inputs(step, input_values)
        step.scalars = _scalars(scalar_values)
        step.done = True

    def _named_inputs(self, step: stages.Step, values) -> Dict[str, object]:
        """The step's inputs by input_check.name_of: its input ops' values, the rows the graph
        took of them by the worker's id, its fed data."""
        named = {input_check.name_of(t, fed=False, taken=t in step.taken): v
                 for t, v in zip(step.inputs, values)}
        named.update({input_check.name_of(t, fed=True): v
                      for t, v in input_check.fed_data(step.feeds or {}).items()})
        return named

    def close(self) -> None:
        """Save a last checkpoint (when configured) and close the session."""
        self._checkpoints.save()
        self.close_after_trial()

    def close_after_trial(self) -> None:
        """Close the session, saving nothing: AUTO kept another plan (runtime/trials.py)."""
        self._checkpoints.restore_signal()
        # Each queue runner closes its queue, cancelling the enqueues under way, and its thread
        # ends quietly (a closed session would fail them with CancelledError instead).
        self._coordinator.request_stop()
        self._coordinator.join(self._queue_threads, stop_grace_period_secs=10)
        self.session.close()

    def take_checkpointer(self, checkpointer) -> None:
        """Save checkpoints from now on (the plan AUTO kept after its trials)."""
        self._checkpoints.take(checkpointer)

    @property
    def input_iterators(self) -> input_position.Iterators:
        return self._checkpoints.checkpointer.iterators

    def save_input(self, checkpoint: str) -> None:
        """This worker's input position beside `checkpoint` (input_position.py)."""
        self._checkpoints.checkpointer.save_input(self.session, checkpoint)

    def count_steps(self) -> None:
        """Count the steps to save after from the global step now (AUTO's trials switched to
        this runner)."""
        if self._checkpoints.checkpointer is not None:
            self._checkpoints.checkpointer.begin(self.session)

    @property
    def settled(self) -> bool:
        """Whether the job trains with the plan it keeps: False while AUTO still times its
        plans (runtime/trials.py), whose steps a benchmark leaves out of its measurement."""
        return True

    @property
    def broadcast_ops(self) -> list:
        """What makes every replica take worker 0's values (passes/allreduce.py)."""
        return contracts.read_broadcasts(self.transformed_graph)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _map_fetch(self, fetch):
        element = self._element(fetch, "fetch")
        if isinstance(element, tf.Variable):  # its value, as Session.run reads it
            element = element.graph.as_graph_element(element)
        if isinstance(element, tf.IndexedSlices):
            return tf.IndexedSlices(*(self._aggregate(self._graphs.find(part, self._aggregated))
                                      for part in (element.values, element.indices,
                                                   element.dense_shape) if part is not None))
        written = element  # the script's own op: the transformed graph's, imported, has no
        # traceback to name its line by
        if isinstance(element, (tf.Tensor, tf.Operation)):
            element = self._graphs.find(element, self._aggregated)
        if isinstance(element, tf.Tensor):
            return self._aggregate(element)
        if isinstance(element, tf.Operation):
            parts = self._initializer_parts(element)
            if parts is not None and parts[0]:
                return self._skip_initializers(element, written, *parts)
            return self._cuts.get(element.name, element)
        return element

    def _initializer_parts(self, op: tf.Operation
                           ) -> Optional[Tuple[List[tf.Operation], List[tf.Operation]]]:
        """(the initializers of global variables and tables, those of local variables) that
        an initializer or a group of them (global_variables_initializer()) runs; None for
        another op."""
        if op.name in self._initializers:
            return [op], []
        if op.name in self._local_initializers:
            return [], [op]
        if op.type == "NoOp" and not op.inputs and op.control_inputs:
            parts = [self._initializer_parts(c) for c in op.control_inputs]
            if all(part is not None for part in parts):
                return ([i for part in parts for i in part[0]],
                        [i for part in parts for i in part[1]])
        return None

    def _skip_initializers(self, op: tf.Operation, written: tf.Operation,
                           skipped: List[tf.Operation], kept: List[tf.Operation]
                           ) -> tf.Operation:
        """Parallax initialized the global variables (the same on every worker, or from the
        latest checkpoint); running their initializers again would set one replica apart.
        Local variables' (a metric's, reset between evaluations) are the worker's own: run."""
        if op.name not in self._skipped_initializers:
            with self.transformed_graph.as_default():
                self._skipped_initializers[op.name] = tf.group(
                    *kept, name="parallax_skipped_initializer")
        log.warning("runner.run(%s) skipped%s: Parallax initializes the variables "
                    "itself (and restores checkpoints); remove this call", _made_at(written),
                    " but for the local variables" if kept else "")
        return self._skipped_initializers[op.name]

    def _aggregate(self, tensor: tf.Tensor) -> tf.Tensor:
        """A fetched gradient is the aggregated one, as training on one device would give."""
        name = self._aggregated.get(tensor.name)
        return tensor if name is None else self.transformed_graph.get_tensor_by_name(name)

    def _element_or_none(self, item):
        """The graph element `item` names, when it is a single tensor or op of the graph."""
        if not isinstance(item, (str, tf.Tensor, tf.Operation)):
            return None
        try:
            return self._element(item, "fetch")
        except ParallaxError:
            return None

    def _element(self, item, what: str):
        if isinstance(item, str):
            try:
                return self.graph.as_graph_element(item)
            except (KeyError, ValueError, TypeError) as error:
                raise ParallaxError(
                    f"{what} {item!r} is not in the graph given to get_runner: {error}. "
                    "Use a tensor or op of that graph, or its name such as 'loss:0'.") from None
        graph = getattr(item, "graph", None)
        if graph is None and isinstance(item, tf.IndexedSlices):
            graph = item.values.graph
        if graph is not self.graph and graph is not self.transformed_graph:
            raise ParallaxError(
                f"{what} {item!r} does not belong to the graph given to get_runner; build "
                "fetches and feeds in that graph (or pass their names).")
        return item


def install_chief_only_saves() -> None:
    """Saver.save(runner, path) on a worker other than the chief writes no file: the chief
    writes the checkpoint, its state file and its meta graph; the others' state files and meta
    graphs would be written at once into one shared folder, or into a folder of their own
    machine that need not exist (their run of the save writes no data: ParallaxRunner.run).
    Idempotent (each get_runner of a worker calls it)."""
    save = tf.compat.v1.train.Saver.save
    if getattr(save, "parallax_chief_only", False):
        return
    signature = inspect.signature(save)

    @functools.wraps(save)
    def chief_only_save(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        session = call.arguments["sess"]
        if isinstance(session, ParallaxRunner) and not session.is_chief:
            call.arguments.update(write_meta_graph=False, write_state=False)
        return save(*call.args, **call.kwargs)

    chief_only_save.parallax_chief_only = True
    tf.compat.v1.train.Saver.save = chief_only_save


def _is_checkpoint_save(element) -> bool:
    """Whether `element` is a Saver's save tensor: the path, after the ops writing the files."""
    if not isinstance(element, (tf.Tensor, tf.Operation)):
        return False
    op = element if isinstance(element, tf.Operation) else element.op
    return any(c.type in ("SaveV2", "MergeV2Checkpoints", "SaveSlices") for c in op.control_inputs)


def _scalars(values: dict) -> dict:
    for name, value in values.items():
        if np.size(value) != 1:
            raise ParallaxError(f"runner.run(report={{{name!r}: ...}}): a reported value must "
                                f"be a scalar; this one has shape {np.shape(value)}")
    return {name: float(np.asarray(value).reshape(())) for name, value in values.items()}


def _initializer_names(graph: tf.Graph) -> set:
    """The initializers Parallax runs itself: of global variables, and of tables."""
    with graph.as_default():
        variables = tf.compat.v1.global_variables()
    return {initializer_op(v).name for v in variables} | {
        op.name for op in graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)}


def _local_initializer_names(graph: tf.Graph) -> set:
    with graph.as_default():
        return {initializer_op(v).name for v in tf.compat.v1.local_variables()}
