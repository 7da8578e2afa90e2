"""The input's position beside a checkpoint (runtime/input_position.py, runtime/checkpoint.py),
in one process: what a save writes, which checkpoint a job resumes from, what is said of an
input whose position cannot be saved."""
import logging

import pytest
import tensorflow as tf

from parallax import contracts
from parallax.config import CheckpointConfig
from parallax.errors import ParallaxError
from parallax.runtime import checkpoint, input_position
from parallax.runtime.checkpoint import Checkpointer
from parallax.runtime.input_position import Record


def _job(dataset_fn, ckpt_dir, num_workers=1, worker_id=0, **saves):
    """A one-worker training graph on `dataset_fn`'s batches, the Checkpointer of worker
    `worker_id` (saving every 2 steps, unless `saves` says otherwise) and a session."""
    graph = tf.Graph()
    with graph.as_default():
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset_fn()).get_next()
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.zeros_initializer())
        step = tf.compat.v1.train.get_or_create_global_step()
        loss = tf.reduce_sum(tf.square(tf.cast(batch, tf.float32) - w))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, step)
        initialize = tf.compat.v1.global_variables_initializer()
    config = CheckpointConfig(ckpt_dir, **(saves or {"save_ckpt_steps": 2}))
    checkpointer = Checkpointer(graph, graph, config, num_workers, worker_id, lambda: 3)
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


def test_a_save_by_time_is_announced_and_every_worker_saves_after_that_step(tmp_path):
    """The chief's time is up after its first step: it announces a save two steps ahead,
    which the other worker (its own graph and session here) reads and saves at too."""
    ckpt = str(tmp_path)
    workers = [_job(lambda: tf.data.Dataset.range(100).batch(2), ckpt, 2, worker_id,
                    save_ckpt_secs=1e-9) for worker_id in (0, 1)]
    for checkpointer, session, _, _ in workers:
        checkpointer.begin(session)
    for _ in range(4):
        for checkpointer, session, _, train in workers:
            _train(checkpointer, session, train, 1)
    path, record = input_position.resume_point(ckpt)
    assert path.endswith("model-3") and record.num_workers == 2
    assert input_position.complete(path, record)


def test_fed_input_is_named_once_at_the_first_checkpoint(tmp_path, caplog):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.zeros_initializer())
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.square(x - w)), step)
        initialize = tf.compat.v1.global_variables_initializer()
    checkpointer = Checkpointer(graph, graph, CheckpointConfig(str(tmp_path), save_ckpt_steps=1),
                                1, 0)
    with tf.compat.v1.Session(graph=graph) as session, caplog.at_level(logging.WARNING,
                                                                       logger="parallax"):
        session.run(initialize)
        checkpointer.begin(session)
        for _ in range(3):
            session.run(train, {x: [1.0, 2.0]})
            checkpointer.note_fed(["x:0"])
            checkpointer.after_run(session, training=True)
    said = [r.getMessage() for r in caplog.records if "feeds" in r.getMessage()]
    assert len(said) == 1 and "x:0" in said[0] and "runner.run(global_step)" in said[0], said
    # no iterator: every checkpoint is complete, the latest resumed
    assert input_position.resume_point(str(tmp_path))[0].endswith("model-3")


def test_a_resume_on_another_combined_batch_says_what_it_reads(monkeypatch):
    monkeypatch.setenv(contracts.INPUT_SKIP_ENV, "72")
    record = Record(4, 6, 3, ["OneShotIterator"], 0, 72)
    same = checkpoint._resume_note("ckpt/model-6", record, 2, 12)
    assert "goes on at its element 72, where the 6 combined batches of 12 ended" in same
    assert "changes" not in same
    changed = checkpoint._resume_note("ckpt/model-6", record, 2, 8)
    assert "the combined batch changes to 8" in changed and "not of 12" in changed
    monkeypatch.delenv(contracts.INPUT_SKIP_ENV)
    assert "this input starts over" in checkpoint._resume_note("ckpt/model-6", record, 2, 12)
    assert "holds no position" in checkpoint._resume_note("ckpt/model-6", None, 4, 12)


def test_a_draws_batch_is_read_under_tf1_shapes_too():
    """Under disable_v2_behavior() a shape's dimension is a Dimension, None or not."""
    from parallax.planning.measure import input_batch
    tf.compat.v1.disable_v2_tensorshape()
    try:
        for drop in (True, False):  # known in the graph; read from a draw
            graph = tf.Graph()
            with graph.as_default():
                tf.compat.v1.data.make_one_shot_iterator(
                    tf.data.Dataset.range(100).batch(8, drop_remainder=drop)).get_next()
            assert input_batch(graph) == (8, None)
    finally:
        tf.compat.v1.enable_v2_tensorshape()
