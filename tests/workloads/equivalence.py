"""Training runs compared against single-device training in the equivalence tests.

As a script it is a Parallax job: every worker trains each configuration of one model on its
shard and saves its variables and the global_step after every step. The tests import
`train_single_device` to compute the reference on the combined batch in-process.

    python equivalence.py --model sparse --resources localhost:0,1 --out DIR [--run-option AR]
        [--configs sgd adam+clip] [--sum] [--ps-off local_aggregation ...] [--checkpoint]
        [--fetch-gradients]
    python equivalence.py --resources R --out DIR --part NAME="--model M --run-option PS ..." ...
        (one job of several settings, each part's results in DIR/NAME)
"""
import argparse
import dataclasses
import itertools
import os
import shlex

import keras
import numpy as np
import tensorflow as tf

import parallax
from tf1 import behaviour

SPARSE_GRADIENTS = "equivalence_sparse_gradients"  # (variable name, IndexedSlices)
OPTIMIZERS = {
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
}
CONFIGS = [f"{opt}{'+clip' if clip else ''}"
           for opt, clip in itertools.product(OPTIMIZERS, (False, True))]
# Built, rewritten and trained after tf.compat.v1.disable_v2_behavior(), as ported TF1 code is:
# reference variables, TF1 shapes (Dimension entries), v1 control flow and DatasetV1.
TF1_CONFIGS = [config for config in CONFIGS if config.endswith("+clip")]


def configs_by_turns(index, count):
    """The configurations the `index`-th of a job's `count` models trains: the job trains each
    configuration in some model, and each model trains both behaviours (TF2, and TF1's with
    clip_by_global_norm) and an optimizer of LOSSES_API and one not. Turn j is the j-th
    optimizer without clipping and the (j+2)-th with it."""
    plain = [config for config in CONFIGS if config not in TF1_CONFIGS]
    return [config for turn in range(index % len(plain), len(plain), count)
            for config in (plain[turn], TF1_CONFIGS[(turn + 2) % len(plain)])]


VOCAB, EMBED, FEATURES, HIDDEN, CLASSES, IDS_PER_EXAMPLE = 40, 4, 6, 8, 3, 3
ID_RANGE = VOCAB // 2  # ids drawn below it (set_dense_ids: every row in every batch)
STEPS, BATCH_PER_WORKER = 20, 4
# 'two-tables': beside the embedding, a table of which a batch reads ~100 rows, nearly all
# distinct, a reference variable (AUTO allgathers it while the embedding goes to the servers).
TAGS_VOCAB, TAGS_PER_EXAMPLE = 10_000, 25
MIN_PARTITIONS = 1  # of the 'partitioned' model's embedding (parallax.get_partitioner)
# 'seq2seq': a decoder predicting each next token of a padded sentence from the embedding
# (shared with the encoder) and the encoded ids, its loss normalized by the tokens that are not
# padding (a count each worker's batch has its own of): by hand, or by tf.compat.v1.losses with
# weights=mask (SUM_BY_NONZERO_WEIGHTS) for the optimizers of LOSSES_API.
SENTENCE, LOSSES_API = 6, ("adam", "adagrad")
MAX_WORKERS = 4
# A checkpoint the trainable variables start from (tf.compat.v1.train.init_from_checkpoint, as
# fine-tuning scripts start), which makes a reference variable's initializer a tensor.
FROM_CHECKPOINT = None
NUM_EXAMPLES = STEPS * BATCH_PER_WORKER * MAX_WORKERS


def _examples(num_examples):
    rng = np.random.RandomState(1234)
    return {
        "x": rng.randn(num_examples, FEATURES).astype(np.float32),
        # Ids drawn from a small range repeat within a batch, so gradients have duplicate rows.
        "ids": rng.randint(0, ID_RANGE, size=(num_examples, IDS_PER_EXAMPLE)).astype(np.int64),
        "label": rng.randint(0, CLASSES, size=num_examples).astype(np.int64),
        "tags": rng.randint(0, TAGS_VOCAB, size=(num_examples, TAGS_PER_EXAMPLE)).astype(
            np.int64),
        # 'seq2seq': sentences of 1 to SENTENCE tokens (ids from 1), padded with 0
        "tokens": np.where(np.arange(SENTENCE + 1) <= rng.randint(1, SENTENCE + 1,
                                                                   size=(num_examples, 1)),
                           rng.randint(1, VOCAB, size=(num_examples, SENTENCE + 1)), 0),
    }


def set_dense_ids():
    """Many ids a example, from the whole vocabulary: each worker's batch touches every row
    of the embedding, whose 'sparse' gradient is then as large as the variable."""
    global IDS_PER_EXAMPLE, ID_RANGE
    IDS_PER_EXAMPLE, ID_RANGE = 60, VOCAB


def write_start_checkpoint(path, model):
    """A checkpoint of `model`'s trainable variables with values of its own, for
    FROM_CHECKPOINT: its path."""
    graph, _, _ = build(model, "sgd", BATCH_PER_WORKER, shard=False)
    with graph.as_default():
        trainable = tf.compat.v1.trainable_variables()
        saver = tf.compat.v1.train.Saver(trainable)
        rng = np.random.RandomState(99)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for variable in trainable:
                variable.load(rng.randn(*variable.shape).astype(np.float32) * 0.3, session)
            return saver.save(session, path)


def _initial(shape, seed):
    value = np.random.RandomState(seed).randn(*shape).astype(np.float32) * 0.5
    return tf.constant_initializer(value)


def _sliced_initial(shape, seed):
    """The rows of one value that a shard of a partitioned variable holds: the variable starts
    the same in any number of shards."""
    value = np.random.RandomState(seed).randn(*shape).astype(np.float32) * 0.5

    def initial(shape, dtype=None, partition_info=None):
        offset = partition_info.var_offset[0] if partition_info is not None else 0
        return tf.constant(value[offset:offset + shape[0]], dtype=dtype)
    return initial


def _keras_logits(features):
    """Keras 3 layers pinned to a GPU, as users write them; soft placement runs them on CPU."""
    with tf.device("/gpu:0"):
        hidden = keras.layers.Dense(HIDDEN, activation="tanh", kernel_initializer=_keras_initial(
            [features.shape[1], HIDDEN], 2))(features)
        return keras.layers.Dense(CLASSES, use_bias=False, kernel_initializer=_keras_initial(
            [HIDDEN, CLASSES], 3))(hidden)


def _keras_initial(shape, seed):
    return keras.initializers.Constant(np.random.RandomState(seed).randn(*shape) * 0.5)


def _lstm(sequence):
    """A Keras 3 LSTM over the looked-up ids: a while loop reading its kernels each step. Keras
    3's LSTM needs control flow v2, so under TF1 behaviour a hand-written one in tf.scan (a v1
    while loop, as dynamic_rnn makes) with the same kernels."""
    if not tf.compat.v1.control_flow_v2_enabled():
        kernel = tf.compat.v1.get_variable("lstm/kernel", [EMBED, 4 * HIDDEN],
                                           initializer=_initial([EMBED, 4 * HIDDEN], 5))
        recurrent = tf.compat.v1.get_variable("lstm/recurrent_kernel", [HIDDEN, 4 * HIDDEN],
                                              initializer=_initial([HIDDEN, 4 * HIDDEN], 6))

        def cell(state, inputs):
            hidden, memory = tf.unstack(state)
            i, f, c, o = tf.split(tf.matmul(inputs, kernel) + tf.matmul(hidden, recurrent), 4,
                                  axis=1)
            memory = tf.sigmoid(f) * memory + tf.sigmoid(i) * tf.tanh(c)
            return tf.stack([tf.sigmoid(o) * tf.tanh(memory), memory])

        steps = tf.transpose(sequence, [1, 0, 2])
        start = tf.zeros(tf.stack([2, tf.shape(sequence)[0], HIDDEN]))
        return tf.compat.v1.scan(cell, steps, initializer=start)[-1][0]
    return keras.layers.LSTM(
        HIDDEN, kernel_initializer=_keras_initial([EMBED, 4 * HIDDEN], 5),
        recurrent_initializer=_keras_initial([HIDDEN, 4 * HIDDEN], 6))(sequence)


MODELS = ("dense", "sparse", "keras", "keras-embedding", "lstm", "partitioned", "two-tables",
          "lookup-sparse", "seq2seq")


def build(model, config, batch, shard, loss_scale=1.0):
    """The single-device graph: same code for the reference and for every worker."""
    optimizer_name, _, clip = config.partition("+")
    # Keras numbers layers per process ('lstm', 'lstm_1', ...): fresh names for every graph, so
    # the reference built in the test process has the names each worker's graph has.
    keras.utils.clear_session()
    graph = tf.Graph()
    with graph.as_default():
        dataset = tf.data.Dataset.from_tensor_slices(_examples(NUM_EXAMPLES))
        if shard:
            dataset = parallax.shard(dataset)
        inputs = tf.compat.v1.data.make_one_shot_iterator(dataset.batch(batch)).get_next()
        features = inputs["x"]
        if model in ("sparse", "lstm", "two-tables", "seq2seq"):
            embedding = tf.compat.v1.get_variable(
                "embedding", [VOCAB, EMBED], initializer=_initial([VOCAB, EMBED], 1))
            looked_up = tf.nn.embedding_lookup(embedding, inputs["ids"])
        elif model == "partitioned":
            embedding = tf.compat.v1.get_variable(
                "embedding", [VOCAB, EMBED], initializer=_sliced_initial([VOCAB, EMBED], 1),
                partitioner=parallax.get_partitioner(MIN_PARTITIONS))
            looked_up = tf.compat.v1.nn.embedding_lookup(embedding, inputs["ids"],
                                                         partition_strategy="div")
        elif model == "lookup-sparse":
            # As recommendation models look features up: embedding_lookup_sparse makes the ids
            # unique first (one gradient row per distinct id), here in a table of two shards.
            embedding = tf.compat.v1.get_variable(
                "embedding", [VOCAB, EMBED], initializer=_sliced_initial([VOCAB, EMBED], 1),
                partitioner=tf.compat.v1.fixed_size_partitioner(2))
            ids = inputs["ids"]
            sparse_ids = tf.SparseTensor(tf.where(tf.ones_like(ids, tf.bool)),
                                         tf.reshape(ids, [-1]), tf.shape(ids, out_type=tf.int64))
            summary = tf.compat.v1.nn.embedding_lookup_sparse(embedding, sparse_ids, None,
                                                              combiner="mean")
        elif model == "keras-embedding":
            looked_up = keras.layers.Embedding(
                VOCAB, EMBED, embeddings_initializer=_keras_initial([VOCAB, EMBED], 1))(
                inputs["ids"])
        if model in ("sparse", "lstm", "partitioned", "keras-embedding", "two-tables",
                     "seq2seq"):
            summary = _lstm(looked_up) if model == "lstm" else tf.reduce_mean(looked_up, axis=1)
        if model in ("sparse", "lstm", "partitioned", "keras-embedding", "two-tables",
                     "lookup-sparse", "seq2seq"):
            features = tf.concat([features, summary], axis=1)
        if model == "two-tables":
            # A reference variable, as TF1 code without resource variables makes it: not
            # split over the servers (passes/split_variables.py), so AUTO allgathers it.
            tags = tf.compat.v1.get_variable(
                "tags", [TAGS_VOCAB, EMBED], initializer=_initial([TAGS_VOCAB, EMBED], 4),
                use_resource=False)
            features = tf.concat([features, tf.reduce_mean(
                tf.nn.embedding_lookup(tags, inputs["tags"]), axis=1)], axis=1)
        if model in ("keras", "keras-embedding"):
            logits = _keras_logits(features)
        else:
            width = features.shape[1]
            w1 = tf.compat.v1.get_variable(
                "w1", [width, HIDDEN], initializer=_initial([width, HIDDEN], 2))
            # Named to sort after 'embedding': TF colocates Adam's beta powers with the first
            # variable by name, and this way that is the sparse one.
            b1 = tf.compat.v1.get_variable(
                "hidden_bias", [HIDDEN], initializer=tf.compat.v1.zeros_initializer())
            classes = VOCAB if model == "seq2seq" else CLASSES
            w2 = tf.compat.v1.get_variable(
                "w2", [HIDDEN, classes], initializer=_initial([HIDDEN, classes], 3))
            hidden = tf.tanh(tf.matmul(features, w1) + b1)
            if model == "seq2seq":
                per_batch = _token_normalized_loss(inputs["tokens"], embedding, hidden, w2,
                                                   optimizer_name in LOSSES_API)
            else:
                per_batch = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=inputs["label"], logits=tf.matmul(hidden, w2)))
        if model in ("keras", "keras-embedding"):
            per_batch = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=inputs["label"], logits=logits))
        loss = tf.identity(loss_scale * per_batch, name="loss")
        if FROM_CHECKPOINT:
            tf.compat.v1.train.init_from_checkpoint(FROM_CHECKPOINT, {
                v.op.name: v.op.name for v in tf.compat.v1.trainable_variables()})
        global_step = tf.compat.v1.train.get_or_create_global_step()
        optimizer = OPTIMIZERS[optimizer_name]()
        grads, variables = zip(*optimizer.compute_gradients(loss))
        for grad, variable in zip(grads, variables):
            if isinstance(grad, tf.IndexedSlices):  # what a script may fetch, to inspect it
                graph.add_to_collection(SPARSE_GRADIENTS, (variable.op.name, grad))
        if clip:
            grads, _ = tf.clip_by_global_norm(grads, 0.3)
        train_op = optimizer.apply_gradients(zip(grads, variables), global_step=global_step)
        # Moving averages of the variables, updated once per step after the update. Not of a
        # reference variable: TensorFlow's initializer of such an average races with the
        # variable's (its initialized_value() reads the variable in a tf.cond), failing about
        # one run in seven on one device too.
        with tf.control_dependencies([train_op]):
            train_op = tf.compat.v1.train.ExponentialMovingAverage(0.9).apply(
                [v for v in tf.compat.v1.trainable_variables() if v.op.type == "VarHandleOp"])
    return graph, train_op, global_step


def _token_normalized_loss(tokens, embedding, encoded, w2, losses_api):
    """The cross entropy of each next token of the sentences, summed over the tokens that are
    not padding and divided by their count, as sequence models' losses are."""
    wd = tf.compat.v1.get_variable("decoder", [EMBED, HIDDEN],
                                   initializer=_initial([EMBED, HIDDEN], 7))
    decoded = tf.tanh(tf.einsum("bte,eh->bth", tf.nn.embedding_lookup(embedding, tokens[:, :-1]),
                                wd) + encoded[:, None, :])
    logits = tf.einsum("bth,hv->btv", decoded, w2)
    targets = tokens[:, 1:]
    mask = tf.cast(tf.not_equal(targets, 0), tf.float32)
    if losses_api:
        return tf.compat.v1.losses.sparse_softmax_cross_entropy(targets, logits, weights=mask)
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets,
                                                                   logits=logits)
    return tf.reduce_sum(cross_entropy * mask) / tf.reduce_sum(mask)


def _train(run, graph, train_op, global_step, fetch_gradients=False):
    """The variables after training, and the global step after each step. With
    `fetch_gradients`, each sparse gradient is fetched with the train op (its rows and ids, an
    IndexedSlices), and the sum over the steps of its dense value is returned as a variable
    named 'gradient_sum/<variable>'."""
    steps = []
    sparse = graph.get_collection(SPARSE_GRADIENTS) if fetch_gradients else []
    sums = {}
    for _ in range(STEPS):
        # Nested fetches by object and by name, the loss on every worker.
        result = run({"train": train_op, "loss": "loss:0", "gradients": [g for _, g in sparse]})
        if not np.isfinite(result["loss"]):
            raise ValueError(f"loss is {result['loss']}")
        for (name, _), value in zip(sparse, result["gradients"]):
            dense = sums.setdefault(f"gradient_sum/{name}", np.zeros(value.dense_shape))
            np.add.at(dense, value.indices, value.values)
        steps.append(run(global_step))
    with graph.as_default():
        names = [v.op.name for v in tf.compat.v1.global_variables()]
        values = run(tf.compat.v1.global_variables())
    return dict(zip(names, values), **sums), steps


def train_single_device(model, config, batch, loss_scale=1.0, fetch_gradients=False):
    with behaviour(config in TF1_CONFIGS):
        graph, train_op, global_step = build(model, config, batch, shard=False,
                                             loss_scale=loss_scale)
        with graph.as_default():
            init = tf.compat.v1.global_variables_initializer()
        session_config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
        with tf.compat.v1.Session(graph=graph, config=session_config) as session:
            session.run(init)
            return _train(session.run, graph, train_op, global_step, fetch_gradients)


def main():
    parser = _parser()
    args = parser.parse_args()
    if args.dense_ids:
        set_dense_ids()
    global FROM_CHECKPOINT
    FROM_CHECKPOINT = args.from_checkpoint
    tf.compat.v1.disable_eager_execution()
    if not args.part:
        _train_models(args, args.out, label="")
    for part in args.part:
        # A part's settings are a get_runner's own; the job's cluster is its first part's
        # (give the first a part that needs servers if any does).
        name, _, text = part.partition("=")
        part_args = parser.parse_args([*shlex.split(text), "--resources", args.resources,
                                       "--out", os.path.join(args.out, name)])
        if part_args.part or part_args.dense_ids or part_args.from_checkpoint:
            parser.error(f"--part {name}: a part takes none of --part, --dense-ids and "
                         "--from-checkpoint")
        _train_models(part_args, part_args.out, label=f"{name}/")


def _parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=lambda text: text.split(","), default=[],
                        help="a model, or several joined by commas, each trained in every "
                             "config in turn, its results in OUT/MODEL/: " + ", ".join(MODELS))
    parser.add_argument("--part", action="append", default=[], metavar="NAME=ARGUMENTS",
                        help="instead of --model: one job trains several settings in turn, "
                             "each part's arguments (all but --resources and --out) its own, "
                             "its results in OUT/NAME/")
    parser.add_argument("--resources", default="localhost:0,1")
    parser.add_argument("--run-option", default="AR")
    parser.add_argument("--out", required=True)
    parser.add_argument("--configs", nargs="*", default=CONFIGS, choices=CONFIGS)
    parser.add_argument("--by-turns", action="store_true",
                        help="each model trains its turns of the configs (configs_by_turns), "
                             "not every one of --configs")
    parser.add_argument("--sum", action="store_true",
                        help="aggregate gradients as the sum over workers, not the mean")
    parser.add_argument("--dense-ids", action="store_true", help="see set_dense_ids")
    parser.add_argument("--from-checkpoint", metavar="PATH",
                        help="the trainable variables start from this checkpoint "
                        "(write_start_checkpoint)")
    parser.add_argument("--search-partitions", action="store_true",
                        help="Config.search_partitions (the 'partitioned' model's shards)")
    parser.add_argument("--ps-off", nargs="*", default=[], metavar="OPTION",
                        choices=[f.name for f in dataclasses.fields(parallax.PSConfig)],
                        help="PSConfig optimizations to turn off")
    parser.add_argument("--hierarchical-allreduce", action="store_true",
                        help="Config(hierarchical_allreduce=True): machine stages wherever "
                             "possible")
    parser.add_argument("--split-variables", action="store_true",
                        help="Config(split_variables=True): the embedding over every server")
    parser.add_argument("--fetch-gradients", action="store_true",
                        help="fetch the sparse gradients with the train op (see _train)")
    parser.add_argument("--checkpoint", action="store_true",
                        help="the chief's checkpoints (CheckpointConfig) in OUT/ckpt/CONFIG")
    parser.add_argument("--trial-steps", type=int, default=parallax.Config.trial_steps,
                        help="Config(trial_steps=N): AUTO's steps with each plan it times")
    parser.add_argument("--trial-margin", type=float,
                        help="Config(trial_margin=F): the rules' plans predicted slower by more "
                        "than F are not timed")
    parser.add_argument("--rejoin-horovod", action="store_true",
                        help="the second config's runner in machine stages (joining Horovod "
                        "again with the process sets), then Horovod left, as after AUTO's "
                        "trials kept a plan without it, and joined again by the third's")
    parser.add_argument("--collectives", choices=["horovod", "tensorflow"],
                        help="Config(collectives=...)")
    return parser


def _train_models(args, out_folder, label):
    """Each of args.model trained in its configurations (all of --configs, or by turns); the
    chief says '{label}{model}: trained' after each."""
    unknown = set(args.model) - set(MODELS)
    if unknown or not args.model:
        raise SystemExit(f"--model: unknown models {sorted(unknown)}" if unknown
                         else "--model or --part is needed")
    config_of_job = config_of(args)
    for index, model in enumerate(args.model):
        out = os.path.join(out_folder, model) if len(args.model) > 1 else out_folder
        os.makedirs(out, exist_ok=True)
        configs = (configs_by_turns(index, len(args.model)) if args.by_turns
                   else args.configs)
        _train_configs(model, configs, args, config_of_job, out)
        print(f"{label}{model}: trained", flush=True)


def config_of(args):
    """The parallax.Config of the command line's settings."""
    return parallax.Config(
        run_option=args.run_option, average_dense=not args.sum, average_sparse=not args.sum,
        search_partitions=args.search_partitions,
        split_variables=True if args.split_variables else None,
        hierarchical_allreduce=True if args.hierarchical_allreduce else None,
        trial_steps=args.trial_steps, trial_margin=args.trial_margin,
        ps_config=parallax.PSConfig(**{option: False for option in args.ps_off}),
        collectives=args.collectives)


def train_in_process(argv, run_workers):
    """The job of the command line `argv` (--model M ... --resources R --out DIR), its workers
    run by `run_workers` (tests/in_process.py): the driver's plan made for M's first graph."""
    args = _parser().parse_args(argv)
    if set(args.configs) & set(TF1_CONFIGS):
        raise ValueError(f"{sorted(set(args.configs) & set(TF1_CONFIGS))}: TF1 behaviour is "
                         "a switch of the process, which its workers share here")
    first, _, _ = build(args.model[0], args.configs[0], BATCH_PER_WORKER, shard=True)
    run_workers(first, args.resources, config_of(args),
                lambda: _train_models(args, args.out, label=""))


def _train_configs(model, configs, args, config_of_job, out):
    """`model` trained in each of `configs`, one get_runner each; every worker's variables
    and global steps in OUT/CONFIG.workerK.npz."""
    for index, config in enumerate(configs):
        with behaviour(config in TF1_CONFIGS):
            graph, train_op, global_step = build(model, config, BATCH_PER_WORKER, shard=True)
            if args.rejoin_horovod:
                config_of_job.hierarchical_allreduce = index == 1
            if args.checkpoint:  # saved when the runner closes
                config_of_job.ckpt_config = parallax.CheckpointConfig(
                    ckpt_dir=os.path.join(out, "ckpt", config))
            runner = parallax.get_runner(graph, args.resources, config_of_job)
            values, steps = _train(runner.run, graph, train_op, global_step,
                                   args.fetch_gradients)
            np.savez(os.path.join(out, f"{config}.worker{runner.worker_id}.npz"),
                     global_steps=np.array(steps), **{f"var/{k}": v for k, v in values.items()})
            runner.close()
        if args.rejoin_horovod and index == 1:
            from parallax import api  # pylint: disable=C0415

            api._process().collectives.leave()  # noqa: SLF001

if __name__ == "__main__":
    main()
