"""Checkpoints: the chief saves every variable of the job — replicas (its own copy) and those on
servers — between its steps, when no update is under way, and restores them when a job starts
again with the same ckpt_dir. Every worker saves its input's position beside them and resumes
it (input_position.py): all save after the same steps, those of save_ckpt_steps, those the
chief announces for save_ckpt_secs, and the last at close or on SIGTERM."""
from __future__ import annotations

import glob
import json
import logging
import os
import time
from typing import Callable, List, Optional, Tuple

import tensorflow as tf

from parallax import contracts, tf_private
from parallax.config import CheckpointConfig
from parallax.rewriting import split_variables
from parallax.rewriting.passes import dynamic_tables
from parallax.runtime import input_position
from parallax.runtime.input_position import Iterators, Record

log = logging.getLogger("parallax")
# The chief turns a save by time into one of an announced step that no worker has finished:
# a worker runs at most one step ahead of the chief, which is in none while it announces.
ANNOUNCED = "parallax-next-save.json"
ANNOUNCE_AHEAD = 2


class Checkpointer:
    """A worker's saves and restores of `graph`, its rewritten copy of `user_graph`.
    `input_batch`: the examples of one draw of the worker's input, for the record
    (measure.input_batch), asked once."""

    def __init__(self, graph: tf.Graph, user_graph: tf.Graph, config: CheckpointConfig,
                 num_workers: int, worker_id: int,
                 input_batch: Callable[[], Optional[int]] = lambda: None):
        self._config = config
        self._user_graph = user_graph
        self._num_workers, self._worker_id = num_workers, worker_id
        self.saves = bool(config.ckpt_dir)
        self.active = self.saves and worker_id == 0  # it writes the variables
        self.iterators = Iterators(graph)
        self._input_batch = input_batch
        self._worker_batch: Optional[int] = None
        self._saver = None
        with graph.as_default():
            self._global_step = tf.compat.v1.train.get_global_step()
        self._start: Optional[int] = None  # the global step when this runner began to train
        # (a global step, the elements of parallax.shard's dataset read by then)
        self._read_at = (0, contracts.read_input_skip() or 0)
        self._runs = 0  # training runs since
        self._last_step: Optional[int] = None
        self._last_time = time.monotonic()
        self._announced: Optional[int] = None
        self._announce_mtime = 0.0
        self._unsaved_input: Optional[str] = None  # why the position cannot be saved, once said
        self._fed: Optional[List[str]] = []  # what a training run was fed; None once said
        self._resumed: Optional[Tuple[Optional[str], Optional[Record]]] = None  # restore's
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
            tables = dynamic_tables.keys_saveables(graph)  # their keys, beside their rows
            if tables:
                saved = tf_private.op_list_to_dict(saved) if isinstance(saved, list) else saved
                saved.update(tables)
            self._saver = tf.compat.v1.train.Saver(saved, max_to_keep=3)
            split_variables.rewrite_uses(graph)
            dynamic_tables.rewrite_uses(graph)  # a table saved as on one device

    def restore(self, session) -> bool:
        """The chief loads the variables of the checkpoint to resume from, if any; True when
        one was loaded."""
        if not self.active:
            return False
        _remove_partial_saves(self._config.ckpt_dir)
        # An earlier job's announcement (the others read it only after this restore).
        if os.path.exists(os.path.join(self._config.ckpt_dir, ANNOUNCED)):
            os.remove(os.path.join(self._config.ckpt_dir, ANNOUNCED))
        self._resumed = input_position.resume_point(self._config.ckpt_dir)
        path = self._resumed[0]
        if path is None:
            return False
        self._saver.restore(session, path)
        log.warning("resumed from checkpoint %s", path)
        return True

    def begin(self, session, resumed: bool = False) -> None:
        """Count steps from now (every worker, its variables ready); with `resumed`, the input
        goes on from the position of the checkpoint the chief restored."""
        self._start, self._runs = self._step(session) or 0, 0
        self._last_step = self._start
        if not (resumed and self.saves):
            return
        self._read_at = (self._start, self._read_at[1])  # an input starting over, or skipped
        path, record = self._resumed or input_position.resume_point(self._config.ckpt_dir)
        if path is not None:
            self.restore_input(session, path, record)
            if (record is not None and record.num_workers == self._num_workers
                    and record.elements_read is not None):
                self._read_at = (record.global_step, record.elements_read)

    def restore_input(self, session, checkpoint: str, record: Optional[Record]) -> None:
        """This worker's input goes on where it was at `checkpoint`, when saved by as many
        workers (another number of workers continues through parallax.shard, api.py)."""
        if record is not None and record.num_workers == self._num_workers:
            self.iterators.restore(session, input_position.worker_prefix(
                checkpoint, self._worker_id, self._num_workers))
        elif self._worker_id == 0 and self.iterators.names:
            log.warning("%s", _resume_note(checkpoint, record, self._num_workers,
                                           self._combined_batch()))

    def after_run(self, session, training: bool) -> None:
        """After each run: save after the steps every worker saves after."""
        if not (self.saves and training and self._start is not None):
            return
        self._runs += 1
        step = self._start + self._runs
        due = bool(self._config.save_ckpt_steps and step % self._config.save_ckpt_steps == 0)
        if self._config.save_ckpt_secs:
            due |= step == self._announced_step()
            if self.active and self._announced is None and (
                    time.monotonic() - self._last_time >= self._config.save_ckpt_secs):
                self._announce(step + ANNOUNCE_AHEAD)
        if due:
            self.save(session)

    def save(self, session) -> None:
        """Every worker its input's position, the chief the variables, after the same step."""
        if not self.saves or self._start is None:
            return
        step = self._start + self._runs if self._global_step is not None else None
        if step is not None and step == self._last_step:
            return
        counted = self._step(session) if self.active and step is not None else step
        if counted != step:
            self._say_unsaved(f"the global step ({counted}) does not count the training runs "
                              f"({step}), by which every worker saves")
            step = counted
        checkpoint = os.path.join(self._config.ckpt_dir, "model")
        checkpoint += "" if step is None else f"-{step}"
        os.makedirs(self._config.ckpt_dir, exist_ok=True)
        self.save_input(session, checkpoint)
        if self.active:
            if self._announced is not None and step is not None and step >= self._announced:
                self._announced = None
            if self._fed and not self.iterators.names:
                log.warning("the input's position is not saved with the checkpoints: the "
                            "script feeds %s (feed_dict), from where its own loop says; a "
                            "resumed job's loop starts where runner.run(global_step) says",
                            ", ".join(self._fed))
                self._fed = None  # said once
            # Saver writes the data under temporary names and renames them, then updates the
            # 'checkpoint' index: a job killed mid-save still finds the previous checkpoint.
            self._saver.save(session, checkpoint, write_meta_graph=False)
            # The graph the script built (its meta graph loads into one device's session),
            # not this worker's rewritten copy.
            tf.compat.v1.train.export_meta_graph(checkpoint + ".meta", graph=self._user_graph,
                                                 clear_devices=True)
            self._write_record(checkpoint)
            input_position.remove_older(self._config.ckpt_dir, self._saver.last_checkpoints)
        self._last_step, self._last_time = step, time.monotonic()

    def note_fed(self, names) -> None:
        """A training run fed `names` (the chief says so at its first save)."""
        if self._fed == []:
            self._fed = sorted(names)

    def save_input(self, session, checkpoint: str) -> None:
        """This worker's input position beside `checkpoint` (a user's Saver's too)."""
        if self._unsaved_input is not None:
            return
        why = self.iterators.save(session, input_position.worker_prefix(
            checkpoint, self._worker_id, self._num_workers))
        if why is not None:
            self._say_unsaved(why)

    def user_saved(self, checkpoint: str) -> None:
        """The chief ran a user's Saver.save (runner.run): the checkpoint's record."""
        self._write_record(checkpoint)

    def _write_record(self, checkpoint: str) -> None:
        if self._unsaved_input is not None:
            return
        step = _step_in(checkpoint)
        combined = self._combined_batch() if self.iterators.names else None
        read = None
        if step is not None and combined is not None:
            read = self._read_at[1] + (step - self._read_at[0]) * combined
        input_position.write_record(checkpoint, Record(
            self._num_workers, step, self._worker_batch, self.iterators.names,
            contracts.read_input_skip() or 0, read))

    def _announce(self, step: int) -> None:
        self._announced = step
        path = os.path.join(self._config.ckpt_dir, ANNOUNCED)
        os.makedirs(self._config.ckpt_dir, exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as file:
            json.dump({"step": step}, file)
        os.replace(path + ".tmp", path)

    def _announced_step(self) -> Optional[int]:
        """The step of the chief's next save by time (its own, or read where it changed)."""
        if self.active:
            return self._announced
        path = os.path.join(self._config.ckpt_dir, ANNOUNCED)
        try:
            mtime = os.stat(path).st_mtime
            if mtime != self._announce_mtime:
                with open(path, encoding="utf-8") as file:
                    self._announced = int(json.load(file)["step"])
                self._announce_mtime = mtime
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none yet, or being replaced: read at the next step
        return self._announced

    def _combined_batch(self) -> Optional[int]:
        if self._worker_batch is None:
            self._worker_batch = self._input_batch()
        return None if self._worker_batch is None else self._worker_batch * self._num_workers

    def _say_unsaved(self, why: str) -> None:
        if self._unsaved_input is None and self._worker_id == 0:
            log.warning("the input's position is not saved with the checkpoints: %s. A job "
                        "resumed from them starts that input over (docs/checkpoints.md)", why)
        self._unsaved_input = why

    def _step(self, session) -> Optional[int]:
        return None if self._global_step is None else int(session.run(self._global_step))


def _step_in(checkpoint: str) -> Optional[int]:
    tail = checkpoint.rsplit("-", 1)
    return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else None


def _resume_note(checkpoint: str, record: Optional[Record], num_workers: int,
                 combined_batch: Optional[int]) -> str:
    if record is None:
        return (f"checkpoint {checkpoint} holds no position of the input: this job starts its "
                "input over")
    skip = contracts.read_input_skip()
    if skip is None:
        return (f"checkpoint {checkpoint} was saved by {record.num_workers} workers and this "
                f"job has {num_workers}: their positions do not apply, and only an input "
                "sharded by parallax.shard(dataset) before its batching goes on where they "
                "were; this input starts over")
    note = (f"checkpoint {checkpoint} was saved by {record.num_workers} workers and this job "
            f"has {num_workers}: parallax.shard's input goes on at its element {skip}, where "
            f"the {record.global_step} combined batches of {record.combined_batch} ended")
    if combined_batch is not None and combined_batch != record.combined_batch:
        note += (f"; the combined batch changes to {combined_batch}: from here on the job "
                 f"is one device's training in batches of {combined_batch}, not of "
                 f"{record.combined_batch}")
    return note


def _remove_partial_saves(ckpt_dir: str) -> None:
    """What a save killed midway leaves: TensorFlow writes a checkpoint's files as
    '<name>.tempstate<random>' and the index as 'checkpoint.tmp<random>', then renames them."""
    for path in glob.glob(os.path.join(glob.escape(ckpt_dir), "*.tempstate*")) + glob.glob(
            os.path.join(glob.escape(ckpt_dir), "checkpoint.tmp*")):
        log.warning("removing %s, left by a save that did not finish", path)
        os.remove(path)
