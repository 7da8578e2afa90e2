"""A run's stages (runtime/stages.py), each on its own, in process: the order the runner calls
them in, the SIGTERM a run defers, a Saver's restore through the runner."""
import os
import signal

import numpy as np
import pytest
import tensorflow as tf

from parallax.runtime import stages
from test_session import _runner


class _Calls(stages.Stage):
    """A stage that notes each call, by its name."""

    def __init__(self, name, calls):
        self._name, self._calls = name, calls

    def before_run(self, step):
        self._calls.append(f"{self._name}.before")

    def after_run(self, step):
        self._calls.append(f"{self._name}.after {step.training}")

    def end_run(self, step):
        self._calls.append(f"{self._name}.end {step.done}")


def test_stages_come_before_in_order_after_a_success_only_and_end_in_reverse():
    runner = _runner(worker_id=0)
    calls = []
    runner._stages += [_Calls("a", calls), _Calls("b", calls)]  # noqa: SLF001
    x = runner.tensors["x"]
    runner.run(runner.tensors["train"], {x: np.ones(2, np.float32)})
    assert calls == ["a.before", "b.before", "a.after True", "b.after True", "b.end True",
                     "a.end True"]
    calls.clear()
    with pytest.raises(tf.errors.InvalidArgumentError):  # x not fed: the run fails
        runner.run(runner.tensors["loss"])
    assert calls == ["a.before", "b.before", "b.end False", "a.end False"]
    runner.close()


class _Checkpointer:
    """What the Checkpoints stage asks of a checkpointer, noting its saves."""
    saves = True

    def __init__(self):
        self.saved, self.after = 0, []

    def save(self, session):
        self.saved += 1

    def after_run(self, session, training):
        self.after.append(training)

    def begin(self, session):
        pass


def _step(**fields):
    return stages.Step([], {}, None, None, will_train=lambda: True, **fields)


def test_a_sigterm_during_a_run_saves_and_exits_after_it_and_between_runs_at_once():
    checkpointer = _Checkpointer()
    checkpoints = stages.Checkpoints(session=None, checkpointer=checkpointer)
    try:
        step = _step(training=True, done=True)
        checkpoints.before_run(step)
        os.kill(os.getpid(), signal.SIGTERM)
        assert checkpointer.saved == 0  # the run under way goes on
        checkpoints.after_run(step)
        assert checkpointer.after == [True]
        with pytest.raises(SystemExit) as stopped:
            checkpoints.end_run(step)
        assert stopped.value.code == 128 + signal.SIGTERM and checkpointer.saved == 1
    finally:
        checkpoints.restore_signal()
    checkpoints = stages.Checkpoints(session=None, checkpointer=checkpointer)
    try:
        with pytest.raises(SystemExit):  # between runs: at once
            os.kill(os.getpid(), signal.SIGTERM)
        assert checkpointer.saved == 2
    finally:
        checkpoints.restore_signal()


def test_the_path_of_a_savers_run_is_its_only_feed():
    assert stages.fed_path({"save/Const:0": b"/tmp/model.ckpt-3"}) == "/tmp/model.ckpt-3"
    assert stages.fed_path({"a": "x", "b": "y"}) is None
    assert stages.fed_path({"a": np.zeros(2)}) is None
    assert stages.fed_path(None) is None


def test_step_inputs_are_added_once():
    step = _step()
    with tf.Graph().as_default():
        a, b = tf.constant(1), tf.constant(2)
    step.add_inputs([a, b])
    step.add_inputs([b, a])
    assert step.inputs == [a, b]
