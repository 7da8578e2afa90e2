"""The input's position beside a checkpoint (runtime/input_position.py, runtime/checkpoint.py),
in one process: what a save writes, which checkpoint a job resumes from, what is said of an
input whose position cannot be saved."""
import logging

import pytest
import tensorflow as tf

from parallax.config import CheckpointConfig
from parallax.errors import ParallaxError
from parallax.runtime import input_position
from parallax.runtime.checkpoint import Checkpointer
from parallax.runtime.input_position import Record


def _job(dataset_fn, ckpt_dir, num_workers=1):
    """A one-worker training graph on `dataset_fn`'s batches, its chief's Checkpointer
    (saving every 2 steps) and a session."""
    graph = tf.Graph()
    with graph.as_default():
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset_fn()).get_next()
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.zeros_initializer())
        step = tf.compat.v1.train.get_or_create_global_step()
        loss = tf.reduce_sum(tf.square(tf.cast(batch, tf.float32) - w))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, step)
        initialize = tf.compat.v1.global_variables_initializer()
    checkpointer = Checkpointer(graph, graph, CheckpointConfig(ckpt_dir, save_ckpt_steps=2),
                                num_workers, 0, lambda: 3)
    session = tf.compat.v1.Session(graph=graph)
    session.run(initialize)
    return checkpointer, session, batch, train


def _train(checkpointer, session, train, steps):
    for _ in range(steps):
        session.run(train)
        checkpointer.after_run(session, training=True)


def test_a_resumed_input_draws_what_the_uninterrupted_one_draws(tmp_path):
    def dataset():
        return tf.data.Dataset.range(100).shuffle(20, seed=2).batch(3).prefetch(2)
    ckpt = str(tmp_path / "ckpt")
    first, session, _, train = _job(dataset, ckpt)
    first.begin(session, resumed=True)
    _train(first, session, train, 5)  # saves after steps 2 and 4
    path, record = input_position.resume_point(ckpt)
    assert path.endswith("model-4") and record == Record(1, 4, 3, record.iterators, 0, 12)
    uninterrupted, session_u, batch_u, train_u = _job(dataset, str(tmp_path / "u"))
    _train(uninterrupted, session_u, train_u, 4)
    expected = [session_u.run(batch_u).tolist() for _ in range(3)]
    resumed, session_r, batch_r, _ = _job(dataset, ckpt)
    resumed.restore(session_r)
    resumed.begin(session_r, resumed=True)
    assert [session_r.run(batch_r).tolist() for _ in range(3)] == expected


def test_a_job_resumes_from_the_latest_checkpoint_every_worker_saved(tmp_path):
    ckpt = str(tmp_path)
    checkpointer, session, _, train = _job(lambda: tf.data.Dataset.range(100).batch(2), ckpt,
                                           num_workers=2)
    checkpointer.begin(session)
    _train(checkpointer, session, train, 4)  # worker 1 of 2 saved nothing
    assert input_position.resume_point(ckpt)[1] is None  # none complete: the latest
    assert input_position.resume_point(ckpt)[0].endswith("model-4")
    # worker 1's position of step 2 only
    checkpointer.iterators.save(session, input_position.worker_prefix(f"{ckpt}/model-2", 1, 2))
    path, record = input_position.resume_point(ckpt)
    assert path.endswith("model-2") and record.num_workers == 2 and record.global_step == 2
    assert record.skip_for(2) == 0 and record.skip_for(3) == 2 * 3 * 2


def test_an_input_whose_position_cannot_be_saved_is_named_once(tmp_path, caplog):
    def generated():
        return tf.data.Dataset.from_generator(lambda: iter(range(50)), tf.int64).batch(2)
    checkpointer, session, _, train = _job(generated, str(tmp_path))
    checkpointer.begin(session)
    with caplog.at_level(logging.WARNING, logger="parallax"):
        _train(checkpointer, session, train, 4)
    said = [r.getMessage() for r in caplog.records if "not saved" in r.getMessage()]
    assert len(said) == 1, said
    assert "GeneratorDataset does not support checkpointing" in said[0]
    assert "starts that input over" in said[0] and "input iterator" in said[0]
    assert input_position.resume_point(str(tmp_path)) == (str(tmp_path / "model-4"), None)


def test_a_record_that_is_not_one_is_named(tmp_path):
    (tmp_path / "model-3.input.json").write_text('{"num_workers": "x"')
    with pytest.raises(ParallaxError, match="model-3.input.json: not a record"):
        input_position.read_record(str(tmp_path / "model-3"))


def test_older_positions_go_with_their_checkpoints(tmp_path):
    for step in (3, 6, 9):
        for suffix in (".input.json", ".input-00000-of-00002.index"):
            (tmp_path / f"model-{step}{suffix}").write_text("")
    input_position.remove_older(str(tmp_path), [str(tmp_path / "model-6"),
                                                str(tmp_path / "model-9")])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"model-{step}{suffix}" for step in (6, 9)
        for suffix in (".input.json", ".input-00000-of-00002.index"))
