"""The input's position in a checkpoint (docs/checkpoints.md).

Each worker saves the state of its tf.data iterators beside the chief's checkpoint
`<checkpoint>`, as `<checkpoint>.input-<worker>-of-<workers>` (a TensorFlow bundle of its own:
an iterator's state is a variant, which a session cannot return). The chief writes the
checkpoint's record `<checkpoint>.input.json` after the variables. A checkpoint resumes its
input only with its record and every worker's file, so a job resumes from the latest such
checkpoint (`resume_point`): a save some worker did not finish (killed, or blocked in a step
when stopped) is passed over, never half used, and nobody waits for anybody while saving.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import re
from typing import List, Optional, Tuple

import tensorflow as tf

from parallax.errors import ParallaxError
from parallax.planning.measure import error_reason
from parallax.vocabulary import ITERATOR_OPS

log = logging.getLogger("parallax")
RECORD_SUFFIX = ".input.json"


@dataclasses.dataclass
class Record:
    """What the chief writes after the variables of a checkpoint."""
    num_workers: int
    global_step: Optional[int]
    worker_batch: Optional[int]  # examples of a worker's draw (measure.input_batch)
    iterators: List[str]
    # Of the dataset given to parallax.shard: the elements this job skipped before its own
    # (a resume on another number of workers), and those its workers had read in all, in
    # draws of worker_batch (None where not known).
    skipped: int = 0
    elements_read: Optional[int] = None

    @property
    def combined_batch(self) -> Optional[int]:
        return None if self.worker_batch is None else self.worker_batch * self.num_workers

    def skip_for(self, num_workers: int) -> Optional[int]:
        """What parallax.shard skips in a job of `num_workers` resuming this checkpoint: as
        the job that saved it, whose iterators' positions go on; else where its combined
        batches ended."""
        return self.skipped if num_workers == self.num_workers else self.elements_read


def worker_prefix(checkpoint: str, worker_id: int, num_workers: int) -> str:
    return f"{checkpoint}.input-{worker_id:05d}-of-{num_workers:05d}"


def write_record(checkpoint: str, record: Record) -> None:
    temporary = checkpoint + RECORD_SUFFIX + ".tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(dataclasses.asdict(record), file)
    os.replace(temporary, checkpoint + RECORD_SUFFIX)


def read_record(checkpoint: str) -> Optional[Record]:
    path = checkpoint + RECORD_SUFFIX
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as file:
            fields = json.load(file)
        return Record(**fields)
    except (ValueError, KeyError, TypeError) as error:
        raise ParallaxError(f"{path}: not a record of the input's position ({error}); "
                            "remove it to resume without the input's position") from None


def complete(checkpoint: str, record: Record) -> bool:
    """Whether the variables and every worker's position of `checkpoint` are saved."""
    return os.path.exists(checkpoint + ".index") and (not record.iterators or all(
        os.path.exists(worker_prefix(checkpoint, i, record.num_workers) + ".index")
        for i in range(record.num_workers)))


def resume_point(ckpt_dir: Optional[str]) -> Tuple[Optional[str], Optional[Record]]:
    """The checkpoint a job in `ckpt_dir` resumes from, and its record: the latest complete
    one, else the latest (its input starts over: none of them has its position)."""
    state = tf.train.get_checkpoint_state(ckpt_dir) if ckpt_dir else None
    if state is None or not state.model_checkpoint_path:
        return None, None
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    for path in reversed(paths):
        path = path if os.path.isabs(path) else os.path.join(ckpt_dir, path)
        record = read_record(path)
        if record is not None and complete(path, record):
            return path, record
    latest = state.model_checkpoint_path
    return (latest if os.path.isabs(latest) else os.path.join(ckpt_dir, latest)), None


def remove_older(ckpt_dir: str, kept: List[str]) -> None:
    """The positions and records of checkpoints older than the oldest one `kept` (the Saver
    removed their variables)."""
    steps = [_step_of(path) for path in kept]
    if not kept or None in steps:
        return
    for path in glob.glob(os.path.join(glob.escape(ckpt_dir), "*.input*")):
        step = _step_of(path)
        if step is not None and step < min(steps):
            os.remove(path)


def _step_of(path: str) -> Optional[int]:
    found = re.search(r"-(\d+)(\.input.*)?$", os.path.basename(path))
    return int(found.group(1)) if found else None


class Iterators:
    """The save and restore of a graph's tf.data iterators' states, to and from a bundle."""

    def __init__(self, graph: tf.Graph):
        self.names = sorted(op.name for op in graph.get_operations()
                            if op.type in ITERATOR_OPS)
        if not self.names:
            return
        handles = [graph.get_operation_by_name(name).outputs[0] for name in self.names]
        count = len(self.names)
        with graph.as_default(), tf.name_scope("parallax_input_position"):
            self._prefix = tf.compat.v1.placeholder(tf.string, [], name="prefix")
            # The default policy: a stateful op in a map (random augmentation) is saved
            # without its state (TensorFlow warns); a generator's state cannot be, and fails.
            states = [tf.raw_ops.SerializeIterator(resource_handle=handle) for handle in handles]
            self._save = tf.raw_ops.SaveV2(prefix=self._prefix, tensor_names=self.names,
                                           shape_and_slices=[""] * count, tensors=states)
            saved = tf.raw_ops.RestoreV2(prefix=self._prefix, tensor_names=self.names,
                                         shape_and_slices=[""] * count,
                                         dtypes=[tf.variant] * count)
            self._restore = [tf.raw_ops.DeserializeIterator(resource_handle=handle,
                                                            serialized=state)
                             for handle, state in zip(handles, saved)]

    def save(self, session, prefix: str) -> Optional[str]:
        """Write the states; None, or why they cannot be saved (naming the input)."""
        if not self.names:
            return None
        try:
            session.run(self._save, {self._prefix: prefix})
        except tf.errors.OpError as error:
            return f"the input iterator {self.names[0]!r}: {error_reason(error.message)}"
        return None

    def restore(self, session, prefix: str) -> None:
        if self.names:
            session.run(self._restore, {self._prefix: prefix})
