"""parallax.MonitoredTrainingSession: TensorFlow's own tf.compat.v1.train.MonitoredSession, its
hooks and its loop, on a Parallax runner, so that a TF1 script's

    with tf.compat.v1.train.MonitoredTrainingSession(...) as sess:
        while not sess.should_stop():
            sess.run(train_op)

runs as written but for its first line. The hooks are those TensorFlow's
MonitoredTrainingSession makes, with its defaults — on the chief, the step counter, summary and
checkpoint savers of checkpoint_dir and the chief-only hooks; everywhere, the user's hooks —
and one more, last, that makes the workers agree on stopping: a hook that asks one worker to
stop (a NanTensorHook, the user's own) stops every worker after the same step, instead of
leaving the others waiting for it in the next one.
"""
from __future__ import annotations

import logging
import os
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from parallax.collectives import Collectives
from parallax.errors import ParallaxError
from parallax.runtime import input_position

log = logging.getLogger("parallax")
USE_DEFAULT = object()  # as TensorFlow's: the argument was not given
ARGUMENTS = {"checkpoint_dir", "scaffold", "hooks", "chief_only_hooks", "save_checkpoint_secs",
             "save_summaries_steps", "save_summaries_secs", "stop_grace_period_secs",
             "log_step_count_steps", "save_checkpoint_steps", "summary_dir", "save_graph_def"}


def monitored_session(runner, checkpoint_dir: Optional[str] = None, scaffold=None, hooks=None,
                      chief_only_hooks=None, save_checkpoint_secs=USE_DEFAULT,
                      save_summaries_steps=USE_DEFAULT, save_summaries_secs=USE_DEFAULT,
                      stop_grace_period_secs: int = 120, log_step_count_steps: int = 100,
                      save_checkpoint_steps=USE_DEFAULT, summary_dir: Optional[str] = None,
                      save_graph_def: bool = True,
                      any_worker_stops: Optional[Callable[[bool], bool]] = None,
                      chief_says: Callable[[str], str] = lambda text: text
                      ) -> tf.compat.v1.train.MonitoredSession:
    """TensorFlow's MonitoredTrainingSession of these arguments on `runner`; `any_worker_stops`
    (this worker's wish, to whether any worker wishes to stop) and `chief_says` (this
    worker's text, to the chief's) wait for every worker."""
    summary_steps, summary_secs = _defaults(save_summaries_steps, save_summaries_secs, 100, None)
    checkpoint_steps, checkpoint_secs = _defaults(save_checkpoint_steps, save_checkpoint_secs,
                                                  None, 600)
    scaffold = scaffold or tf.compat.v1.train.Scaffold()
    all_hooks = []
    if runner.is_chief:
        all_hooks += list(chief_only_hooks or [])
        summary_dir = summary_dir or checkpoint_dir
        if summary_dir and log_step_count_steps and log_step_count_steps > 0:
            all_hooks.append(tf.compat.v1.train.StepCounterHook(
                output_dir=summary_dir, every_n_steps=log_step_count_steps))
        if summary_dir and ((summary_steps or 0) > 0 or (summary_secs or 0) > 0):
            all_hooks.append(tf.compat.v1.train.SummarySaverHook(
                scaffold=scaffold, save_steps=summary_steps, save_secs=summary_secs,
                output_dir=summary_dir))
        if checkpoint_dir and ((checkpoint_steps or 0) > 0 or (checkpoint_secs or 0) > 0):
            all_hooks.append(tf.compat.v1.train.CheckpointSaverHook(
                checkpoint_dir, save_steps=checkpoint_steps, save_secs=checkpoint_secs,
                scaffold=scaffold, save_graph_def=save_graph_def))
    elif checkpoint_dir and (checkpoint_steps or 0) > 0:
        all_hooks.append(InputPositionHook(runner, checkpoint_dir, checkpoint_steps))
    if (runner.is_chief and checkpoint_dir and checkpoint_secs and not checkpoint_steps
            and runner.num_workers > 1 and runner.input_iterators.names):
        log.warning("the monitored session saves checkpoints by time (save_checkpoint_secs): "
                    "they hold no position of the input, which only the chief would save; "
                    "with save_checkpoint_steps every worker saves its own (docs/checkpoints.md)")
    all_hooks += list(hooks or [])
    if any_worker_stops is not None:
        all_hooks.append(StopTogetherHook(any_worker_stops))
    # The runner runs the graph's queue runners (shuffle_batch's) and stops them at close:
    # TensorFlow's session would start them a second time, through the runner.
    queue_runners = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.QUEUE_RUNNERS)
    started, queue_runners[:] = list(queue_runners), []
    try:
        return tf.compat.v1.train.MonitoredSession(
            session_creator=RunnerSessionCreator(runner, scaffold, checkpoint_dir, chief_says),
            hooks=all_hooks, stop_grace_period_secs=stop_grace_period_secs)
    finally:
        queue_runners[:] = started


def _defaults(steps, secs, default_steps, default_secs):
    """TensorFlow's rule: neither given, the defaults; one given, the other off."""
    if steps is USE_DEFAULT and secs is USE_DEFAULT:
        return default_steps, default_secs
    return (None if steps is USE_DEFAULT else steps), (None if secs is USE_DEFAULT else secs)


class RunnerSessionCreator(tf.compat.v1.train.SessionCreator):
    """The runner as the monitored session's session: Parallax initialized the variables (the
    same on every worker); the scaffold is finalized, as TensorFlow's creators do, for the
    hooks' saver and summaries; the latest checkpoint of checkpoint_dir, as the chief finds it,
    is restored on every worker, as every worker must (supervision.md). `chief_says` (this
    worker's text, to the chief's) waits for every worker: none saves the checkpoint of step 0
    before all have chosen."""

    def __init__(self, runner, scaffold, checkpoint_dir: Optional[str],
                 chief_says: Callable[[str], str] = lambda text: text):
        self._runner = runner
        self._scaffold = scaffold
        self._checkpoint_dir = checkpoint_dir
        self._chief_says = chief_says
        self._created = False

    def create_session(self):
        if self._created:
            # MonitoredSession recreates its session after an Aborted or Unavailable error.
            raise ParallaxError(
                "the job lost a process or a server: a monitored session cannot recover "
                "within the job; use Config(max_restarts=N) with checkpoints to restart it")
        self._created = True
        self._scaffold.finalize()
        latest = self._chief_says(input_position.resume_point(self._checkpoint_dir)[0] or "")
        if latest:
            self._scaffold.saver.restore(self._runner, latest)
        return self._runner


class InputPositionHook(tf.compat.v1.train.SessionRunHook):
    """A worker other than the chief saves its input's position where and when the chief's
    CheckpointSaverHook saves a checkpoint by steps: at the session's start, every `steps`
    global steps from there, and at its end (input_position.py)."""

    def __init__(self, runner, checkpoint_dir: str, steps: int):
        self._runner = runner
        self._path = os.path.join(checkpoint_dir, "model.ckpt")
        self._steps = steps
        self._global_step = self._last = None

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def after_create_session(self, session, coord):
        self._save(int(session.run(self._global_step)))

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        if run_values.results + 1 >= self._last + self._steps:  # as TensorFlow's timer
            step = int(run_context.session.run(self._global_step))
            if step >= self._last + self._steps:
                self._save(step)

    def end(self, session):
        step = int(session.run(self._global_step))
        if step != self._last:
            self._save(step)

    def _save(self, step: int) -> None:
        self._runner.save_input(f"{self._path}-{step}")
        self._last = step


class StopTogetherHook(tf.compat.v1.train.SessionRunHook):
    """Last of the hooks: after each step, whether any worker's hooks asked it to stop, so that
    all stop after the same step (the workers of a synchronous job wait for each other in
    every step)."""

    def __init__(self, any_worker_stops: Callable[[bool], bool]):
        self._any_worker_stops = any_worker_stops

    def after_run(self, run_context, run_values):
        if self._any_worker_stops(run_context.stop_requested):
            run_context.request_stop()


TEXT_BYTES = 4096  # a path the chief broadcasts: a broadcast takes one length on all


def chief_text(collectives: Collectives) -> Callable[[str], str]:
    """The chief's text on every worker (the collectives' broadcast from the chief)."""
    broadcast = collectives.chief_vector("parallax_chief_says")

    def says(mine: str) -> str:
        encoded = mine.encode()
        if len(encoded) > TEXT_BYTES:
            raise ParallaxError(f"a checkpoint path longer than {TEXT_BYTES} bytes: {mine!r}")
        values = broadcast(np.frombuffer(encoded.ljust(TEXT_BYTES, b"\0"), np.uint8))
        return bytes(values.astype(np.uint8)).rstrip(b"\0").decode()
    return says
