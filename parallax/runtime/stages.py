"""A runner.run's concerns, each a stage with one owner, as TensorFlow's MonitoredSession keeps
one concern per SessionRunHook. The runner (session.py) maps the script's fetches and feeds to
its graph and runs the step (steps.py); around that run its stages, in order:

- `Recording`: parallax.verify's record of the first training steps (recording.py);
- `InputDigests`: the first training step's input, digested for the driver (input_check.py);
- `Profiling`: the runs Config.profile_config traces;
- `Checkpoints`: the saves due after a step, a Saver's save or restore run through the runner,
  and the save a SIGTERM asks for, made between runs;
- `Progress`: the heartbeat's view of the run, its training step and reported scalars.

`before_run` is called in that order, then the run, then `after_run` in that order where the
run succeeded, and `end_run` in the reverse order whatever happened (a stage's end encloses
those after it, as nested contexts do).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import signal
import sys
import threading
from typing import Callable, Dict, List, Optional, Set

import tensorflow as tf

from parallax.runtime import input_check, input_position, recording
from parallax.vocabulary import INPUT_OP_TYPES

log = logging.getLogger("parallax")
# A restore each worker reports to the driver, which stops a job where one worker restored and
# another trained on without (Horovod's habit of restoring in rank 0 alone, then broadcasting):
# its replicas would keep their values, and the workers train different models.
RESTORED = ("restored a checkpoint (saver.restore(runner, path), which every worker runs, as "
            "the script does on one device, not only the chief)")


@dataclasses.dataclass
class Step:
    """One run as its stages see it: what it fetches and feeds (in the runner's graph), what
    the stages add, and what the run gave."""
    fetches: list
    reported: Dict[str, tf.Tensor]  # runner.run(report=...): scalars for the driver
    feeds: Optional[dict]
    feed_dict: Optional[dict]  # as the script gave it
    will_train: Callable[[], bool]  # whether the run will be a training step (before it)
    options: object = None
    run_metadata: object = None
    saved: Optional[str] = None  # the path of a Saver's save run through the runner
    inputs: List[tf.Tensor] = dataclasses.field(default_factory=list)  # fetched beside
    taken: Set[tf.Tensor] = dataclasses.field(default_factory=set)  # rows taken by worker id
    # What the run gave
    done: bool = False
    values: list = dataclasses.field(default_factory=list)
    training: bool = False
    restore: bool = False
    seconds: float = 0.0
    scalars: Dict[str, float] = dataclasses.field(default_factory=dict)
    named_inputs: Dict[str, object] = dataclasses.field(default_factory=dict)  # name_of's
    # What the step's input ops give (StepInputs.of), found once for the stages that read it
    found_inputs: Optional[List[tf.Tensor]] = None

    @functools.cached_property
    def ops(self) -> List[tf.Operation]:
        return [getattr(fetch, "op", fetch) for fetch in self.fetches]

    @functools.cached_property
    def fed(self) -> Set[tf.Tensor]:
        return set(self.feeds or {})

    def add_inputs(self, tensors: List[tf.Tensor]) -> None:
        self.inputs += [t for t in tensors if t not in self.inputs]


class Stage:
    """A concern of a run: each method does nothing unless the stage's concern needs it."""

    def before_run(self, step: Step) -> None:
        """Before the run: what it adds to the run (step.inputs, options)."""

    def after_run(self, step: Step) -> None:
        """After a run that succeeded."""

    def end_run(self, step: Step) -> None:
        """After the run, whether it succeeded or raised."""


class StepInputs:
    """What a step's input ops give (shared by the stages that read the step's input)."""

    def __init__(self, user_graph: tf.Graph):
        self._input_ops = {op.name for op in user_graph.get_operations()
                           if op.type in INPUT_OP_TYPES}

    def of(self, step: Step) -> List[tf.Tensor]:
        if step.found_inputs is None:
            step.found_inputs = input_check.step_inputs(step.ops, step.fed, self._input_ops)
        return step.found_inputs


class InputDigests(Stage):
    """Digests of the first training step's input go to the driver, which warns where every
    worker read the same input (input_check.py)."""

    def __init__(self, heartbeat, inputs: StepInputs):
        self._heartbeat, self._step_inputs = heartbeat, inputs

    def before_run(self, step: Step) -> None:
        if self._heartbeat.digests_reported:
            return
        found = self._step_inputs.of(step)
        step.taken = set(input_check.taken_rows(step.ops, step.fed, found))
        step.add_inputs(found + sorted(step.taken, key=lambda t: t.name))

    def after_run(self, step: Step) -> None:
        if step.named_inputs and not self._heartbeat.digests_reported:
            self._heartbeat.report_digests(input_check.data_digests(step.named_inputs))


class Recording(Stage):
    """parallax.verify's distributed run: the chief's variables before the first training
    step, each training step's input and draws, and the variables after the last."""

    def __init__(self, recorder: recording.Recorder, inputs: StepInputs,
                 read_variables: Callable[[], Dict[str, object]],
                 read_final: Callable[[], Dict[str, object]]):
        self._recorder, self._step_inputs = recorder, inputs
        # Through the runner, a run of their own: before the first step, and after the last
        # (recording.final_values)
        self._read_variables, self._read_final = read_variables, read_final

    def before_run(self, step: Step) -> None:
        if not self._recorder.active:
            return
        step.add_inputs(self._step_inputs.of(step) + recording.step_draws(step.ops, step.fed))
        if self._recorder.needs_initial and step.will_train():
            self._recorder.write_initial(self._read_variables())

    def end_run(self, step: Step) -> None:
        if step.done and step.training and self._recorder.active:
            if self._recorder.write_step({name.partition(" ")[2]: value
                                          for name, value in step.named_inputs.items()
                                          if not name.startswith("taken ")}):
                self._recorder.finish(self._read_final())


class Profiling(Stage):
    def __init__(self, profiler):
        self._profiler = profiler  # parallax.runtime.profile.Profiler: which runs to trace
        self._traced = False

    def before_run(self, step: Step) -> None:
        step.options, step.run_metadata, self._traced = self._profiler.next_run(
            step.options, step.run_metadata)

    def after_run(self, step: Step) -> None:
        if self._traced:
            self._profiler.write(step.run_metadata, step.seconds)


class TableSizes(Stage):
    """The ids each server's part of a dynamic embedding holds, reported with each training
    step as the script's own scalars are (read while the step runs)."""

    def __init__(self, sizes: Dict[str, tf.Tensor]):
        self._sizes = sizes

    def before_run(self, step: Step) -> None:
        if step.will_train():
            step.reported.update(self._sizes)


class Progress(Stage):
    """The driver's view of this worker's runs (runner.heartbeat): when one runs,
    its training steps, the scalars reported and a restore."""

    def __init__(self, heartbeat):
        self._heartbeat = heartbeat

    def before_run(self, step: Step) -> None:
        self._heartbeat.run_started()

    def end_run(self, step: Step) -> None:
        self._heartbeat.run_finished(step.training, step.scalars,
                                     mark=RESTORED if step.restore else None)


class Checkpoints(Stage):
    """The checkpoints' part of a run, and a SIGTERM's save: the driver stopping the job saves
    a checkpoint before the process exits, between runs (at once, or when the run or save
    under way ends; a run that never ends, waiting for a peer that is gone, ends with the
    SIGKILL that follows)."""

    def __init__(self, session: tf.compat.v1.Session, checkpointer=None):
        self._session = session
        self.checkpointer = checkpointer
        self._busy = False  # in a run or a save: a SIGTERM waits for its end
        self._stop_requested = False
        self._previous_sigterm = None
        if checkpointer is not None and checkpointer.saves:
            self._save_on_sigterm()

    def take(self, checkpointer) -> None:
        """Save checkpoints from now on (the plan AUTO kept after its trials)."""
        self.checkpointer = checkpointer
        checkpointer.begin(self._session)
        if checkpointer.saves:
            self._save_on_sigterm()

    def before_run(self, step: Step) -> None:
        self._busy = True

    def after_run(self, step: Step) -> None:
        """A save due after a training step; a user's Saver's save (its record) or restore
        (this worker's input position, where saved)."""
        if self.checkpointer is None:
            return
        if step.saved is not None:
            self.checkpointer.user_saved(step.saved)
        elif step.restore and (path := fed_path(step.feed_dict)) is not None:
            self.checkpointer.restore_input(self._session, path,
                                            input_position.read_record(path))
        if step.training and step.feed_dict:
            self.checkpointer.note_fed(str(getattr(key, "name", key))
                                       for key in step.feed_dict)
        self.checkpointer.after_run(self._session, step.training)

    def end_run(self, step: Step) -> None:
        self._busy = False
        if self._stop_requested:
            self._save_and_exit()

    def save(self) -> None:
        """A last checkpoint (when configured): the runner closes."""
        if self.checkpointer is not None:
            self._busy = True
            self.checkpointer.save(self._session)
            self._busy = False

    def restore_signal(self) -> None:
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    def _save_on_sigterm(self) -> None:
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
            self.checkpointer.save(self._session)
            log.warning("stopped by SIGTERM after saving a checkpoint")
        except Exception as error:  # pylint: disable=broad-except
            log.warning("stopped by SIGTERM; the checkpoint could not be saved: %s", error)
        sys.exit(128 + signal.SIGTERM)


def fed_path(feed_dict) -> Optional[str]:
    """The path a Saver's save or restore run is fed (its only feed)."""
    if not feed_dict or len(feed_dict) != 1:
        return None
    path = list(feed_dict.values())[0]
    path = path.decode() if isinstance(path, bytes) else path
    return path if isinstance(path, str) else None
