"""Checkpoints: the chief saves every variable of the job — replicas (its own copy) and those on
servers — between its steps, when no update is under way, and restores them when a job starts
again with the same ckpt_dir."""
from __future__ import annotations

import glob
import logging
import os
import time
from typing import Optional

import tensorflow as tf

from parallax import tf_private
from parallax.config import CheckpointConfig
from parallax.rewriting import split_variables

log = logging.getLogger("parallax")


class Checkpointer:
    def __init__(self, graph: tf.Graph, config: CheckpointConfig, is_chief: bool):
        self._config = config
        self.active = bool(config.ckpt_dir) and is_chief
        self._saver = self._global_step = None
        self._last_step: Optional[int] = None
        self._last_time = time.monotonic()
        if not self.active:
            return  # save/restore ops for every variable only where they will run
        with graph.as_default():
            # The saver sees the variables under their original names (the containers the
            # runner uses on servers are not part of them), so a new job finds them again; a
            # variable split in shards is saved whole, as on one device.
            saved = tf.compat.v1.global_variables()
            whole = split_variables.whole_reads(graph)
            if whole:
                shards = {family.shard(member, j)
                          for family in split_variables.split_families(graph)
                          for member in family.members for j in range(family.shards)}
                saved = tf_private.op_list_to_dict([v for v in saved if v.op.name not in shards])
                saved.update(whole)
            self._saver = tf.compat.v1.train.Saver(saved, max_to_keep=3)
            split_variables.rewrite_uses(graph)
            self._global_step = tf.compat.v1.train.get_global_step()

    def restore(self, session) -> bool:
        """Load the latest checkpoint, if any; True when one was loaded."""
        if self.active:
            _remove_partial_saves(self._config.ckpt_dir)
        latest = tf.train.latest_checkpoint(self._config.ckpt_dir) if self.active else None
        if latest is None:
            return False
        self._saver.restore(session, latest)
        self._last_step = self._step(session)
        log.warning("resumed from checkpoint %s", latest)
        return True

    def after_run(self, session) -> None:
        """Save when the configured number of steps or seconds has passed (chief only)."""
        if not self.active:
            return
        step = self._step(session)
        by_steps = (self._config.save_ckpt_steps and step is not None and step != self._last_step
                    and step % self._config.save_ckpt_steps == 0)
        by_time = (self._config.save_ckpt_secs
                   and time.monotonic() - self._last_time >= self._config.save_ckpt_secs)
        if by_steps or by_time:
            self.save(session, step)

    def save(self, session, step=None) -> None:
        if not self.active or (step is not None and step == self._last_step):
            return
        os.makedirs(self._config.ckpt_dir, exist_ok=True)
        # Saver writes the data under temporary names and renames them, then updates the
        # 'checkpoint' index: a job killed mid-save still finds the previous checkpoint.
        self._saver.save(session, os.path.join(self._config.ckpt_dir, "model"), global_step=step)
        self._last_step, self._last_time = step, time.monotonic()

    def current_step(self, session) -> Optional[int]:
        return self._step(session) if self.active else None

    def _step(self, session) -> Optional[int]:
        return None if self._global_step is None else int(session.run(self._global_step))


def _remove_partial_saves(ckpt_dir: str) -> None:
    """What a save killed midway leaves: TensorFlow writes a checkpoint's files as
    '<name>.tempstate<random>' and the index as 'checkpoint.tmp<random>', then renames them."""
    for path in glob.glob(os.path.join(glob.escape(ckpt_dir), "*.tempstate*")) + glob.glob(
            os.path.join(glob.escape(ckpt_dir), "checkpoint.tmp*")):
        log.warning("removing %s, left by a save that did not finish", path)
        os.remove(path)
