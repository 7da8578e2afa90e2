"""parallax.dynamic_embedding on one device, in a plain session, which a distributed job must
equal: a table trains as a static table whose rows start at the ids' first values would; a new
id's first row depends on the id and the table alone; a Saver resumes it bit for bit; bad input
is refused naming the table. Then under Parallax, its workers threads of this process
(tests/in_process.py): the table on the servers equals one device, its checkpoints restore onto
other clusters, the driver refuses what would not fit."""
import threading

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax import contracts
from parallax.embeddings.initial_rows import from_user
from parallax.errors import ParallaxError

DIM = 4
# Each step brings ids never seen before, and ids seen in earlier steps (some twice).
BATCHES = [[3, 17, 3, 40], [17, 99, 5, 5], [40, 1000, 3, 7], [7, 7, 123456789, 99],
           [2, 3, 5, 40]]
OPTIMIZERS = {
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
    "ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.001),
}


def _keys(batch, key_dtype):
    return [str(i).encode() for i in batch] if key_dtype == tf.string else batch


def _loss(rows, labels):
    # Rows meet a dense weight, so that the table's gradient is not a function of its rows alone.
    weight = tf.compat.v1.get_variable("weight", [DIM, 1],
                                       initializer=tf.compat.v1.constant_initializer(0.3))
    logits = tf.reshape(tf.matmul(tf.reshape(rows, [-1, DIM]), weight), [-1])
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=labels[:tf.size(logits)], logits=logits))


def _labels():
    return tf.constant([1.0, 0.0, 1.0, 1.0])


def _sparse(keys, key_dtype):
    """The batch's ids as a SparseTensor of two examples of two ids each."""
    return tf.SparseTensor([[0, 0], [0, 1], [1, 0], [1, 1]],
                           tf.convert_to_tensor(keys, key_dtype), [2, 2])


def _train_dynamic(optimizer, key_dtype, sparse):
    graph = tf.Graph()
    with graph.as_default():
        table = parallax.dynamic_embedding("user", dim=DIM, capacity=64, key_dtype=key_dtype)
        ids = tf.compat.v1.placeholder(key_dtype, [4])
        rows = table.lookup(_sparse(ids, key_dtype) if sparse else ids,
                            combiner="sqrtn" if sparse else None)
        opt = OPTIMIZERS[optimizer]()
        train = opt.minimize(_loss(rows, _labels()))
        keys, values = table.export()
        row_of_key = table.keys.export()
        slots = {name: opt.get_slot(table.variable, name) for name in opt.get_slot_names()}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for batch in BATCHES:
                session.run(train, {ids: _keys(batch, key_dtype)})
            found_keys, found_values, (slot_keys, slot_rows), slot_values = session.run(
                [keys, values, row_of_key, slots])
    by_key = dict(zip(found_keys.tolist(), found_values))
    slots_by_key = {name: dict(zip(slot_keys.tolist(), value[slot_rows]))
                    for name, value in slot_values.items()}
    return by_key, slots_by_key


def _train_static(optimizer, key_dtype, sparse, seen):
    """The same model on a static table of the ids `seen`, each row starting at the id's
    first value as the dynamic table draws it."""
    graph = tf.Graph()
    with graph.as_default():
        first = from_user(None, "user", DIM).rows(tf.constant(seen, key_dtype), DIM, tf.float32)
        table = tf.compat.v1.Variable(first, name="static", use_resource=True)
        index = tf.compat.v1.placeholder(tf.int64, [4])
        if sparse:
            rows = tf.nn.embedding_lookup_sparse(table, _sparse(index, tf.int64), None,
                                                 combiner="sqrtn")
        else:
            rows = tf.nn.embedding_lookup(table, index)
        opt = OPTIMIZERS[optimizer]()
        train = opt.minimize(_loss(rows, _labels()))
        slots = {name: opt.get_slot(table, name) for name in opt.get_slot_names()}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for batch in BATCHES:
                keys = _keys(batch, key_dtype)
                session.run(train, {index: [seen.index(key) for key in keys]})
            values, slot_values = session.run([table, slots])
    return ({key: values[i] for i, key in enumerate(seen)},
            {name: {key: value[i] for i, key in enumerate(seen)}
             for name, value in slot_values.items()})


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_a_table_trains_as_a_static_table_of_its_ids_first_values(optimizer):
    """Every optimizer, its slots per id; int64 ids looked up densely, string ids in a
    SparseTensor combined per example: bit for bit the static table's rows and slots."""
    for key_dtype, sparse in [(tf.int64, False), (tf.string, True)]:
        seen = list(dict.fromkeys(key for batch in BATCHES for key in _keys(batch, key_dtype)))
        dynamic, dynamic_slots = _train_dynamic(optimizer, key_dtype, sparse)
        static, static_slots = _train_static(optimizer, key_dtype, sparse, seen)
        assert sorted(dynamic) == sorted(seen)
        for key in seen:
            np.testing.assert_array_equal(dynamic[key], static[key], err_msg=str(key))
            for name in static_slots:
                np.testing.assert_array_equal(dynamic_slots[name][key],
                                              static_slots[name][key], err_msg=f"{name} {key}")
        moved = [key for key in seen if not np.array_equal(
            static[key], _first_rows([key], key_dtype)[0])]
        assert moved, "training moved no row"


def _first_rows(keys, key_dtype, name="user", initializer=None, capacity=64, batches=None):
    """The rows a fresh table gives `keys`, looked up in `batches` (default: all at once)."""
    graph = tf.Graph()
    with graph.as_default():
        table = parallax.dynamic_embedding(name, dim=DIM, capacity=capacity,
                                           key_dtype=key_dtype, initializer=initializer)
        ids = tf.compat.v1.placeholder(key_dtype, [None])
        rows = table.lookup(ids)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for batch in batches or []:
                session.run(rows, {ids: batch})
            return session.run(rows, {ids: keys})


def test_a_new_ids_row_depends_on_the_id_and_the_table_alone():
    keys = [5, 77, 2**40, -3]
    alone = _first_rows(keys, tf.int64)
    np.testing.assert_array_equal(  # after other ids, in another order, in a larger table
        _first_rows(keys, tf.int64, capacity=1000, batches=[[9, 2**40], [-3, 8, 5]]), alone)
    assert not np.array_equal(_first_rows(keys, tf.int64, name="item"), alone)
    assert len({row.tobytes() for row in alone}) == len(keys)
    words = [b"a", b"b", b"", "é".encode()]
    np.testing.assert_array_equal(_first_rows(words, tf.string, batches=[[b"b", b"z"]]),
                                  _first_rows(words, tf.string))


def test_initializers_of_tf_compat_v1_and_keras_draw_their_distributions():
    keys = list(range(4000))

    def drawn(initializer):
        return _first_rows(keys, tf.int64, initializer=initializer, capacity=4000)

    uniform = drawn(tf.compat.v1.random_uniform_initializer(-0.5, 1.5))
    assert -0.5 <= uniform.min() and uniform.max() < 1.5
    assert abs(uniform.mean() - 0.5) < 0.02
    truncated = drawn(tf.keras.initializers.TruncatedNormal(mean=1.0, stddev=0.1))
    assert 0.8 <= truncated.min() and truncated.max() <= 1.2
    assert abs(truncated.mean() - 1.0) < 0.005
    normal = drawn(tf.compat.v1.random_normal_initializer(stddev=2.0))
    assert abs(normal.std() - 2.0) < 0.05 and normal.max() > 4.0
    assert (drawn(tf.compat.v1.zeros_initializer()) == 0).all()
    assert (drawn(0.25) == 0.25).all()
    assert not np.array_equal(  # the initializer's seed is the table's too
        drawn(tf.keras.initializers.RandomNormal(seed=1)),
        drawn(tf.keras.initializers.RandomNormal(seed=2)))
    with pytest.raises(ParallaxError, match="dynamic embedding 'user': initializer"):
        drawn(tf.keras.initializers.GlorotUniform())


def test_bad_use_is_refused_naming_the_table():
    with tf.Graph().as_default():
        table = parallax.dynamic_embedding("user", dim=DIM, capacity=3)
        with pytest.raises(ParallaxError, match="'user': the graph has a table of that name"):
            parallax.dynamic_embedding("user", dim=8, capacity=10)
        with pytest.raises(ParallaxError, match="'user': ids of int32, the table's keys are "
                                                "int64"):
            table.lookup(tf.constant([1, 2]))
        with pytest.raises(ParallaxError, match="'user': combiner 'mean' is for a "
                                                "SparseTensor"):
            table.lookup(tf.constant([1], tf.int64), combiner="mean")
        with pytest.raises(ParallaxError, match="'item': keys of float32"):
            parallax.dynamic_embedding("item", dim=DIM, capacity=3, key_dtype=tf.float32)
        with pytest.raises(ParallaxError, match="'item': dim"):
            parallax.dynamic_embedding("item", dim=0, capacity=3)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows = table.lookup(ids)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(rows, {ids: [1, 2, 1]})
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="dynamic embedding user is full: its 3 rows"):
                session.run(rows, {ids: [3, 4]})
            assert session.run(table.size()) == 2  # the failed lookup gave out nothing


def test_a_saver_resumes_a_table_bit_for_bit(tmp_path):
    def run(steps, restore=None, save=None):
        graph = tf.Graph()
        with graph.as_default():
            table = parallax.dynamic_embedding("user", dim=DIM, capacity=64)
            ids = tf.compat.v1.placeholder(tf.int64, [4])
            train = tf.compat.v1.train.AdamOptimizer(0.05).minimize(
                _loss(table.lookup(ids), _labels()))
            saver = tf.compat.v1.train.Saver()
            keys, values = table.export()
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                if restore:
                    saver.restore(session, restore)
                for batch in steps:
                    session.run(train, {ids: batch})
                if save:
                    saver.save(session, save)
                found_keys, found_values = session.run([keys, values])
        return {key: found_values[i] for i, key in enumerate(found_keys.tolist())}

    through = run(BATCHES)
    run(BATCHES[:2], save=str(tmp_path / "model"))
    resumed = run(BATCHES[2:], restore=str(tmp_path / "model"))
    assert sorted(resumed) == sorted(through)
    for key in through:
        np.testing.assert_array_equal(resumed[key], through[key])


# -- under Parallax: workers as threads of this process, servers in it (tests/in_process.py) --

WORKER_BATCH = 6  # examples of two ids each
STEPS = 4


def _combined_batches(seed=7, first=0):
    """Each step's combined batch: ids from `first` on, drawn from a growing range, so new ids
    come every step, with repeats across workers."""
    draws = np.random.RandomState(seed)
    return [first + draws.randint(0, 8 + 10 * step, size=(2 * WORKER_BATCH, 2)).astype(np.int64)
            for step in range(STEPS)]


def _model(key_dtype=tf.int64, min_count=1):
    graph = tf.Graph()
    with graph.as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        table = parallax.dynamic_embedding("user", dim=DIM, capacity=256, key_dtype=key_dtype,
                                           min_count=min_count)
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        keys = tf.strings.as_string(ids) if key_dtype == tf.string else ids
        rows = tf.reshape(table.lookup(keys), [-1, 2 * DIM])
        weight = tf.compat.v1.get_variable("weight", [2 * DIM, 1],
                                           initializer=tf.compat.v1.constant_initializer(0.2))
        labels = tf.cast(tf.math.floormod(ids[:, 0], 2), tf.float32)
        # A second lookup of the table (a sequence model's targets, say): a term of its own.
        second = tf.reduce_sum(table.lookup(keys[:, 1]), 1)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=labels, logits=tf.reshape(tf.matmul(rows, weight), [-1]) + 0.1 * second))
        train = tf.compat.v1.train.AdagradOptimizer(0.2).minimize(loss, global_step=global_step)
        fetches = {"train": train, "export": table.export(), "size": table.size(),
                   "weight": weight, "saver": tf.compat.v1.train.Saver()}
    return graph, ids, fetches


def _by_key(keys, values):
    return {key: values[i] for i, key in enumerate(keys.tolist())}


@pytest.mark.parametrize("run_option,key_dtype", [("PS", tf.int64), ("HYBRID", tf.string)])
def test_under_parallax_a_table_lives_on_the_servers_and_trains_as_on_one_device(
        run_option, key_dtype):
    """Two machines, a server each: the table's rows split over both servers, each giving its
    own ids rows; every id's row ends as one device's on the combined batches (PS: the dense
    weight on a server too; HYBRID: allreduced), and no worker holds a key."""
    import in_process
    batches = _combined_batches()
    graph, ids, fetches = _model(key_dtype)
    with graph.as_default(), tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        for batch in batches:
            session.run(fetches["train"], {ids: batch})
        expected, expected_size = session.run([fetches["export"], fetches["size"]])
    expected = _by_key(*expected)

    def work():
        graph, ids, fetches = _model(key_dtype)
        runner = parallax.get_runner(graph, "127.0.0.1:0;127.0.0.2:0",
                                     parallax.Config(run_option=run_option))
        worker = contracts.read_cluster().worker_id
        for batch in batches:
            runner.run(fetches["train"],
                       {ids: batch[worker * WORKER_BATCH:(worker + 1) * WORKER_BATCH]})
        copy = runner.session.graph
        keys_on = {op.device for op in copy.get_operations()
                   if op.type == "MutableHashTableV2" and op.name.startswith("user/keys/")}
        # The script's own table of keys, cut from the lookups, stays empty on the worker.
        on_worker = runner.session.run(copy.get_tensor_by_name(fetches["size"].name))
        keys_on.add(f"{on_worker} keys on the worker")
        return runner.run([fetches["export"], fetches["size"]]), keys_on

    for (export, size), keys_on in in_process.run_workers(
            graph, "127.0.0.1:0;127.0.0.2:0", parallax.Config(run_option=run_option), work):
        assert size == expected_size == len(expected)
        found = _by_key(*export)
        assert sorted(found) == sorted(expected)
        for key, row in expected.items():
            np.testing.assert_allclose(found[key], row, rtol=1e-5, atol=1e-6, err_msg=str(key))
        assert sorted(keys_on) == ["/job:ps/task:0/device:CPU:0", "/job:ps/task:1/device:CPU:0",
                                   "0 keys on the worker"], keys_on


def test_run_option_ar_refuses_a_table_naming_it_and_the_options_that_take_it():
    from parallax import driver
    from parallax.planning.analysis import analyze
    graph = _model()[0]
    config = parallax.Config(run_option="AR")
    with pytest.raises(ParallaxError, match="dynamic embedding 'user': run option AR keeps "
                                            ".*run_option PS, HYBRID or AUTO"):
        driver.make_job_plans(graph, analyze(graph), "127.0.0.1:0,1", config.plan_options,
                              config.launch_settings)


def _one_device(batches, restore=None, save=None, min_count=1):
    """The model trained on `batches` in a plain session (from checkpoint `restore`, saved
    to `save`): its rows by id."""
    graph, ids, fetches = _model(min_count=min_count)
    with graph.as_default(), tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        if restore:
            fetches["saver"].restore(session, restore)
        for batch in batches:
            session.run(fetches["train"], {ids: batch})
        if save:
            fetches["saver"].save(session, save)
        return _by_key(*session.run(fetches["export"]))


def _job(resources, batches, restore=None, save=None, min_count=1):
    """The same under Parallax (PS) on `resources`, each worker on its share of each batch:
    worker 0's rows by id."""
    import in_process
    workers = len(resources.split(";"))

    def work():
        graph, ids, fetches = _model(min_count=min_count)
        runner = parallax.get_runner(graph, resources, parallax.Config(run_option="PS"))
        worker, share = contracts.read_cluster().worker_id, len(batches[0]) // workers
        if restore:
            fetches["saver"].restore(runner, restore)
        for batch in batches:
            runner.run(fetches["train"], {ids: batch[worker * share:(worker + 1) * share]})
        if save:
            fetches["saver"].save(runner, save)
        return _by_key(*runner.run(fetches["export"]))

    return in_process.run_workers(_model()[0], resources, parallax.Config(run_option="PS"),
                                  work)[0]


def test_a_checkpoint_holds_a_table_as_one_device_lays_it_out(tmp_path):
    """A Saver's checkpoint of a job of two servers restores onto the same job (the rows it
    had), onto three servers (each id moved to its part there) and onto one device, each
    going on as the job that was not interrupted; and a program without Parallax reads the
    ids and their rows from it."""
    # 8 steps: 4 before the checkpoint, 4 after with ids old and new
    batches = _combined_batches() + _combined_batches(seed=8, first=20)
    checkpoint = str(tmp_path / "model")
    through = _one_device(batches)
    saved = _job("127.0.0.1:0;127.0.0.2:0", batches[:4], save=checkpoint)

    keys = tf.train.load_variable(checkpoint, "user/keys-keys")
    rows = tf.train.load_variable(checkpoint, "user/keys-values")
    values = tf.train.load_variable(checkpoint, "user/embedding")
    assert sorted(rows.tolist()) == list(range(len(keys)))  # one device's rows 0..n-1
    served = _by_key(keys, values[rows])
    assert sorted(served) == sorted(saved)
    for key, row in saved.items():
        np.testing.assert_array_equal(served[key], row)

    resumed = _job("127.0.0.1:0;127.0.0.2:0", batches[4:], restore=checkpoint)
    uninterrupted = _job("127.0.0.1:0;127.0.0.2:0", batches)
    assert sorted(resumed) == sorted(uninterrupted)
    for key, row in uninterrupted.items():  # bit for bit
        np.testing.assert_array_equal(resumed[key], row, err_msg=str(key))
    for resumed in (resumed,
                    _job("127.0.0.1:0;127.0.0.2:0;127.0.0.3:0", batches[4:],
                         restore=checkpoint),
                    _one_device(batches[4:], restore=checkpoint)):
        assert sorted(resumed) == sorted(through)
        for key, row in through.items():
            np.testing.assert_allclose(resumed[key], row, rtol=1e-5, atol=1e-6,
                                       err_msg=str(key))


def test_the_driver_refuses_a_server_over_its_memory_and_a_checkpoint_of_another_shape(
        tmp_path):
    from parallax import driver
    from parallax.planning import server_memory
    from parallax.planning.analysis import analyze
    graph = _model()[0]
    config = parallax.Config(run_option="PS")
    plan = driver.make_job_plans(graph, analyze(graph), "127.0.0.1:0;127.0.0.2:0",
                                 config.plan_options, config.launch_settings)[0]
    held = server_memory.held_bytes(graph, plan)
    # user/embedding: 256 rows of 4 floats and an Adagrad slot, half on each server
    assert sorted(held) == [0, 1]
    assert [held[server]["user/embedding"] for server in (0, 1)] == [128 * 4 * 4 * 2] * 2
    most = max(sum(variables.values()) for variables in held.values())
    server_memory.check_server_memory(graph, plan, most)
    with pytest.raises(ParallaxError, match=r"dynamic embedding 'user': its part on server \d "
                                            r"\(capacity 256, dim 4, with its slots\) .*more "
                                            rf"than PSConfig\(server_memory_bytes={most - 1}\)"):
        server_memory.check_server_memory(graph, plan, most - 1)
    with pytest.raises(parallax.ConfigError, match="server_memory_bytes"):
        parallax.Config(ps_config=parallax.PSConfig(server_memory_bytes=0))

    checkpoint = str(tmp_path / "model")
    _one_device(_combined_batches()[:1], save=checkpoint)
    server_memory.check_checkpoint(graph, checkpoint)
    for dim, capacity, what in [(8, 256, r"holds rows of \[4\], the table's are of dim 8"),
                                (4, 128, "holds [0-9]+ ids in a table of capacity 256, the "
                                         "table's capacity is 128")]:
        other = tf.Graph()
        with other.as_default():
            parallax.dynamic_embedding("user", dim=dim, capacity=capacity)
        with pytest.raises(ParallaxError, match=f"dynamic embedding 'user': the checkpoint "
                                                f".*model {what}"):
            server_memory.check_checkpoint(other, checkpoint)


def test_asynchronous_training_gives_each_id_one_row_on_its_server():
    """Config(sync=False): each worker's steps apply on their own, but an id seen by both
    workers at once still gets one row, on its part's server."""
    import in_process
    batches = _combined_batches()
    config = parallax.Config(run_option="PS", sync=False)

    def work():
        graph, ids, fetches = _model()
        runner = parallax.get_runner(graph, "127.0.0.1:0;127.0.0.2:0", config)
        worker = contracts.read_cluster().worker_id
        for batch in batches:
            runner.run(fetches["train"],
                       {ids: batch[worker * WORKER_BATCH:(worker + 1) * WORKER_BATCH]})
        both_trained.wait(timeout=in_process.TIMEOUT_SECS)  # no step agreement to wait for
        return runner.run([fetches["export"], fetches["size"]])

    both_trained = threading.Barrier(2)
    distinct = set(np.concatenate(batches).ravel().tolist())
    for (keys, values), size in in_process.run_workers(_model()[0], "127.0.0.1:0;127.0.0.2:0",
                                                       config, work):
        assert size == len(distinct) and sorted(keys.tolist()) == sorted(distinct)
        assert np.isfinite(values).all()


def test_with_min_count_an_id_gets_a_row_at_the_step_it_is_seen_in_that_many_times(tmp_path):
    """min_count=2 on one device: an id seen in one step (however often in it) has no row and
    looks up its first value; at its second step it gets its row. Under Parallax (two
    servers, each counting its own ids' steps, a step once whichever workers see it) the same
    ids get rows with the same values, and the counts go on through a checkpoint restored on
    three servers."""
    steps = [np.array([[1, 1], [2, 3]] * 6), np.array([[1, 4], [5, 5]] * 6),
             np.array([[3, 4], [6, 2]] * 6), np.array([[7, 6], [6, 1]] * 6)]
    graph, ids, fetches = _model(min_count=2)
    with graph.as_default(), tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        held = []
        for batch in steps:
            session.run(fetches["train"], {ids: batch})
            held.append(sorted(session.run(fetches["export"])[0].tolist()))
    assert held == [[], [1], [1, 2, 3, 4], [1, 2, 3, 4, 6]]

    through = _one_device(steps, min_count=2)
    checkpoint = str(tmp_path / "model")
    _job("127.0.0.1:0;127.0.0.2:0", steps[:2], save=checkpoint, min_count=2)
    resumed = _job("127.0.0.1:0;127.0.0.2:0;127.0.0.3:0", steps[2:], restore=checkpoint,
                   min_count=2)
    assert sorted(resumed) == sorted(through) == [1, 2, 3, 4, 6]
    for key, row in through.items():
        np.testing.assert_allclose(resumed[key], row, rtol=1e-5, atol=1e-6, err_msg=str(key))
