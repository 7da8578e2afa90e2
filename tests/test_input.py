"""Input helpers outside a job: parallax.shard and parallax.num_shards_and_shard_id are the
identity and (1, 0) in the driver; shard refuses what it cannot split, saying what to use."""
import pytest
import tensorflow as tf

import parallax


def test_outside_a_job_the_input_is_whole_and_the_worker_is_shard_0_of_1():
    assert parallax.shard(["a.csv", "b.csv"]) == ["a.csv", "b.csv"]
    dataset = tf.data.Dataset.range(4)
    assert parallax.shard(dataset) is dataset
    with tf.Graph().as_default():
        num_shards, shard_id = parallax.num_shards_and_shard_id()
        assert num_shards.dtype == shard_id.dtype == tf.int64
        with tf.compat.v1.Session() as session:
            assert session.run([num_shards, shard_id]) == [1, 0]


def test_input_that_cannot_be_sharded_is_refused_with_what_to_use():
    with pytest.raises(parallax.ParallaxError, match="takes a tf.data.Dataset or a list of "
                                                    "file names, got ndarray.*feed each worker"):
        parallax.shard(__import__("numpy").arange(10))


def test_fewer_files_than_workers_leave_a_worker_without_input(monkeypatch):
    from parallax import worker
    monkeypatch.setattr(worker, "count_and_id", lambda: (4, 3))
    assert parallax.shard([f"part-{i}" for i in range(8)]) == ["part-3", "part-7"]
    with pytest.raises(parallax.ParallaxError, match="3 files for 4 workers leave worker 3 none"):
        parallax.shard(["a", "b", "c"])
