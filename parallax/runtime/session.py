"""Session wrapper: runs the transformed graph, taking the user's fetches and feeds as they
were written against the original graph (objects or names, nested as Session.run takes them)."""
from __future__ import annotations

import functools
import inspect
import logging
import os
import signal
import sys
import sysconfig
import threading
import time
from typing import Dict, List, Optional, Set, Tuple

import numpy as np
import tensorflow as tf

from parallax import contracts, tf_private
from parallax.errors import ParallaxError
from parallax.rewriting.graph_map import GraphMap
from parallax.runtime import fetches as fetches_structure
from parallax.runtime import input_check, input_position, recording
from parallax.runtime.steps import Steps
from parallax.vocabulary import INPUT_OP_TYPES, initializer_op, start_queue_runners

log = logging.getLogger("parallax")
# A restore each worker reports to the driver, which stops a job where one worker restored and
# another trained on without (Horovod's habit of restoring in rank 0 alone, then broadcasting):
# its replicas would keep their values, and the workers train different models.
RESTORED = ("restored a checkpoint (saver.restore(runner, path), which every worker runs, as "
            "the script does on one device, not only the chief)")


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
        self._profiler = profiler  # parallax.runtime.profile.Profiler: which runs to trace
        self._checkpointer = checkpointer
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
        self._heartbeat = heartbeat  # the driver's view of this worker's steps (runner.control)
        # Digests of the first training step's input go to the driver (runtime/input_check.py).
        self._check_input = check_input and heartbeat is not None and num_workers > 1
        self._taken: Set[tf.Tensor] = set()  # input_check.taken_rows of the step checked
        self._recorder = recorder  # parallax.verify's record of the first steps (recording.py)
        self._busy = False  # in a run or a save: a SIGTERM waits for its end
        self._stop_requested = False
        self._previous_sigterm = None
        if checkpointer is not None and checkpointer.saves:
            self._save_on_sigterm()
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

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None, report=None):
        """Session.run on the original graph's fetches and feeds. `report`: scalars to show
        in the driver's progress bar and metrics file, averaged over workers, e.g.
        {"loss": loss}; they are computed in the same run."""
        self.last_run = (False, 0.0)
        saving = _is_checkpoint_save(self._element_or_none(fetches))
        saved = _fed_path(feed_dict) if saving else None
        if saved is not None and self._checkpointer is not None:
            self._checkpointer.save_input(self.session, saved)  # every worker its own
        if saving and not self.is_chief:
            # Saver.save(runner, path): the chief writes the checkpoint; the others would write
            # the same files at once.
            return list(feed_dict.values())[0] if feed_dict else None
        leaves, build = fetches_structure.flatten(fetches)
        mapped = [self._map_fetch(leaf) for leaf in leaves]
        reported = {name: self._map_fetch(value) for name, value in (report or {}).items()}
        feeds = None if feed_dict is None else {
            self._graphs.find(self._element(key, "feed key")): value
            for key, value in feed_dict.items()}
        checked = self._step_inputs(mapped, feeds)
        if self._recorder is not None and self._recorder.needs_initial and (
                self._steps.is_training((mapped, reported, checked), feeds)):
            self._recorder.write_initial(recording.variable_values(self.graph, self.run))
        traced = False
        if self._profiler is not None:
            options, run_metadata, traced = self._profiler.next_run(options, run_metadata)
        if self._heartbeat is not None:
            self._heartbeat.run_started()
        self._busy, training, restore, scalars = True, False, False, {}
        try:
            started = time.perf_counter()
            (values, scalar_values, input_values), training, restore = self._steps.run(
                self.session, (mapped, reported, checked), feeds, options, run_metadata)
            inputs = self._named_inputs(checked, input_values, feeds) if training else {}
            if inputs and self._check_input and not self._heartbeat.digests_reported:
                self._heartbeat.report_digests(input_check.data_digests(inputs))
            result = build(values)
            self.last_run = (training, time.perf_counter() - started)
            if traced:
                self._profiler.write(run_metadata, self.last_run[1])
            scalars = _scalars(scalar_values)
            if self._checkpointer is not None:
                self._after_run(training, restore, saved, feed_dict)
        finally:
            self._busy = False
            if self._heartbeat is not None:
                self._heartbeat.run_finished(training, scalars,
                                             mark=RESTORED if restore else None)
            if self._stop_requested:
                self._save_and_exit()
        if training and self._recorder is not None and self._recorder.active:
            if self._recorder.write_step({name.partition(" ")[2]: value
                                          for name, value in inputs.items()
                                          if not name.startswith("taken ")}):
                self._recorder.finish(recording.variable_values(self.graph, self.run))
        return result

    def _after_run(self, training: bool, restore: bool, saved: Optional[str],
                   feed_dict) -> None:
        """The checkpoints' part of a run: a save due after a training step; a user's
        Saver's save (its record) or restore (this worker's input position, where saved)."""
        if saved is not None:
            self._checkpointer.user_saved(saved)
        elif restore and (path := _fed_path(feed_dict)) is not None:
            self._checkpointer.restore_input(self.session, path, input_position.read_record(path))
        if training and feed_dict:
            self._checkpointer.note_fed(str(getattr(key, "name", key)) for key in feed_dict)
        self._checkpointer.after_run(self.session, training)

    def _step_inputs(self, fetches, feeds) -> List[tf.Tensor]:
        """What the step's input ops give, while this worker has its input to report (to the
        driver, or to parallax.verify's record)."""
        if not ((self._check_input and not self._heartbeat.digests_reported)
                or (self._recorder is not None and self._recorder.active)):
            return []
        user_ops = {op.name for op in self.graph.get_operations()
                    if op.type in INPUT_OP_TYPES}
        ops, fed = [getattr(f, "op", f) for f in fetches], set(feeds or {})
        found = input_check.step_inputs(ops, fed, user_ops)
        self._taken = (set(input_check.taken_rows(ops, fed, found)) if self._check_input
                       and not self._heartbeat.digests_reported else set())
        if self._recorder is not None and self._recorder.active:
            found += recording.step_draws(ops, fed)
        return found + sorted(self._taken, key=lambda t: t.name)

    def _named_inputs(self, tensors, values, feeds) -> Dict[str, object]:
        """The step's inputs by input_check.name_of: its input ops' values, the rows the graph
        took of them by the worker's id, its fed data."""
        named = {input_check.name_of(t, fed=False, taken=t in self._taken): v
                 for t, v in zip(tensors, values)}
        named.update({input_check.name_of(t, fed=True): v
                      for t, v in input_check.fed_data(feeds or {}).items()})
        return named


    def close(self) -> None:
        """Save a last checkpoint (when configured) and close the session."""
        if self._checkpointer is not None:
            self._busy = True
            self._checkpointer.save(self.session)
            self._busy = False
        self.close_after_trial()

    def close_after_trial(self) -> None:
        """Close the session, saving nothing: AUTO kept another plan (runtime/trials.py)."""
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        # Each queue runner closes its queue, cancelling the enqueues under way, and its thread
        # ends quietly (a closed session would fail them with CancelledError instead).
        self._coordinator.request_stop()
        self._coordinator.join(self._queue_threads, stop_grace_period_secs=10)
        self.session.close()

    def take_checkpointer(self, checkpointer) -> None:
        """Save checkpoints from now on (the plan AUTO kept after its trials)."""
        self._checkpointer = checkpointer
        checkpointer.begin(self.session)
        if checkpointer.saves:
            self._save_on_sigterm()

    @property
    def input_iterators(self) -> input_position.Iterators:
        return self._checkpointer.iterators

    def save_input(self, checkpoint: str) -> None:
        """This worker's input position beside `checkpoint` (input_position.py)."""
        self._checkpointer.save_input(self.session, checkpoint)

    def count_steps(self) -> None:
        """Count the steps to save after from the global step now (AUTO's trials switched to
        this runner)."""
        if self._checkpointer is not None:
            self._checkpointer.begin(self.session)

    @property
    def settled(self) -> bool:
        """Whether the job trains with the plan it keeps: False while AUTO still times its
        plans (runtime/trials.py), whose steps a benchmark leaves out of its measurement."""
        return True

    @property
    def broadcast_ops(self) -> list:
        """What makes every replica take worker 0's values (passes/allreduce.py)."""
        return contracts.read_broadcasts(self.transformed_graph)

    def _save_on_sigterm(self) -> None:
        """A SIGTERM (the driver stopping the job) saves a checkpoint before the process exits,
        between steps: at once, or when the run or save under way ends (a run that never ends,
        waiting for a peer that is gone, ends with the SIGKILL that follows)."""
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread

        def on_sigterm(*_):
            if self._busy:
                self._stop_requested = True
            else:
                self._save_and_exit()

        self._previous_sigterm = signal.signal(signal.SIGTERM, on_sigterm)

    def _save_and_exit(self) -> None:
        self._stop_requested, self._busy = False, True
        try:
            self._checkpointer.save(self.session)
            log.warning("stopped by SIGTERM after saving a checkpoint")
        except Exception as error:  # pylint: disable=broad-except
            log.warning("stopped by SIGTERM; the checkpoint could not be saved: %s", error)
        sys.exit(128 + signal.SIGTERM)

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


def _fed_path(feed_dict) -> Optional[str]:
    """The path a Saver's save or restore run is fed (its only feed)."""
    if not feed_dict or len(feed_dict) != 1:
        return None
    path = list(feed_dict.values())[0]
    path = path.decode() if isinstance(path, bytes) else path
    return path if isinstance(path, str) else None


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
