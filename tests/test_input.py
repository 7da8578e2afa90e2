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


def _first_batches(shuffle, workers=2, rows=200, batch=32):
    """Each worker's first batch of a shuffled dataset's share, as name_of names its feeds:
    `shuffle(worker)` its permutation of the rows. The labels repeat within a batch."""
    import numpy as np
    data = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    batches = []
    for worker in range(workers):
        mine = shuffle(worker)[worker::workers][:batch]
        batches.append({"feed features:0": data[mine], "feed labels:0": mine[:, None] % 2,
                        "random dropout:0": np.random.rand(batch)})
    return batches


def test_first_batches_with_rows_in_common_are_found_and_said_with_what_to_do(monkeypatch):
    """DeepFM's example shuffled with an unseeded np.random in every worker, then took each
    worker's share: the shares overlapped. Each worker's digests carry a sample of its rows'
    hashes (the same rows on every worker); the driver finds those in two workers' batches."""
    import numpy as np
    from parallax.runtime import input_check

    def own_seed(worker):
        return np.random.RandomState(worker).permutation(200)

    reported = [input_check.data_digests(named) for named in _first_batches(own_seed)]
    assert not any("random" in name for digested in reported for name in digested)
    assert any(name.startswith("rows 0 feed features") for name in reported[0])
    assert not any("labels" in name and name.startswith("rows") for name in reported[0])
    shared = input_check.shared_rows(reported)
    assert list(shared) == ["feed features:0"] and shared["feed features:0"] >= 1
    said = input_check.shared_rows_warning(shared, 2)
    assert said.startswith("the first training batches of the 2 workers have rows in common "
                           "(rows also in another worker's batch, of up to 80 compared per "
                           "input: feed 'features': ")
    assert "unseeded np.random" in said and "parallax.shard(dataset)" in said

    def one_seed(worker):  # shuffled alike, then each worker's share: disjoint
        return np.random.RandomState(7).permutation(200)

    assert input_check.shared_rows(
        [input_check.data_digests(named) for named in _first_batches(one_seed)]) == {}
    # An input equal on every worker is the identical-input warning's, not this one's.
    same = [input_check.data_digests(_first_batches(one_seed)[0])] * 2
    assert input_check.shared_rows(same) == {}
    assert "rows" not in input_check.warning(sorted(same[0]), 2).split("(")[1].split(":")[0]


def test_row_digests_leave_the_digests_within_what_a_beat_may_carry():
    import numpy as np
    from parallax.runtime import input_check
    from runner.beat_message import MAX_DIGESTS
    many = {f"feed x{i}:0": np.arange(4 * i, 4 * i + 400).reshape(100, 4) for i in range(40)}
    found = input_check.data_digests(many)
    assert len(found) == MAX_DIGESTS and all(len(digest) <= 64 for digest in found.values())
    one = input_check.data_digests({"feed x:0": np.arange(400).reshape(100, 4)})
    assert len(one) == 1 + 16 and len("".join(
        digest for name, digest in one.items() if name.startswith("rows"))) == 80 * 12


def test_the_driver_says_once_which_of_the_two_mistakes_the_workers_made(monkeypatch):
    """The driver's watchdog, on the workers' first reports: all equal is the unsharded input,
    rows in common the overlapping shuffles; said once, once every worker has reported."""
    import numpy as np
    from parallax import launch
    from parallax.runtime import input_check
    from runner.beat_signing import encode_beat
    from runner.control_server import ControlServer
    said = []
    monkeypatch.setattr(launch, "say", said.append)
    batches = _first_batches(lambda worker: np.random.RandomState(worker).permutation(200))
    workers = ["h:worker:0", "h:worker:1"]
    for reports, expected in [(batches, "have rows in common"),
                              ([batches[0]] * 2, "every worker read the same input")]:
        said.clear()
        control = ControlServer("job", workers, workers, 2.0, 60.0)
        check = launch._watchdog(control, warn_unsharded_input=True)
        try:
            for sequence, (name, named) in enumerate(zip(workers, reports), start=1):
                check(set())
                assert not said  # not before every worker has reported
                control.receive(encode_beat(control.key, dict(
                    job="job", name=name, sequence=sequence,
                    progress={"digests": input_check.data_digests(named)})))
            check(set())
            check(set())
        finally:
            control.stop()
        assert len(said) == 1 and expected in said[0], said
