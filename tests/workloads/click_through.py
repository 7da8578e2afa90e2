"""A click-through model fed as DeepFM's fit() feeds it (issue 69): feature ids and values of
39 fields through feed_dict, a training step of 8 rows, and between training steps evaluation
passes of 256 rows that fetch the loss and the predictions, not the training op.

    python tests/workloads/click_through.py RESOURCES RUN_OPTION STEPS

trains STEPS steps, evaluating after every EVALUATE_EVERY, as a job or under `python -m
parallax.plan`; the tests run it in-process (`build`, `fit`)."""
import sys

import numpy as np

import parallax  # first: gradients are recorded from here on
import tensorflow as tf

FIELDS = 39
IDS_PER_FIELD = 100  # field f's ids are f*100 .. f*100+99, as DeepFM's feature dictionary
BATCH = 8
EVALUATION_ROWS = 256
EVALUATION_PASSES = 3
EVALUATE_EVERY = 2


def build() -> tf.Graph:
    """DeepFM's graph in small: first- and second-order terms of the embedded fields and a
    deep layer over them, fed through placeholders."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        index = tf.compat.v1.placeholder(tf.int32, [None, FIELDS], name="feat_index")
        value = tf.compat.v1.placeholder(tf.float32, [None, FIELDS], name="feat_value")
        label = tf.compat.v1.placeholder(tf.float32, [None, 1], name="label")
        embeddings = tf.compat.v1.get_variable("feature_embeddings",
                                               [FIELDS * IDS_PER_FIELD, 4])
        bias = tf.compat.v1.get_variable("feature_bias", [FIELDS * IDS_PER_FIELD, 1])
        embedded = tf.nn.embedding_lookup(embeddings, index) * value[:, :, None]
        first_order = tf.reduce_sum(tf.nn.embedding_lookup(bias, index)[:, :, 0] * value, 1)
        summed = tf.reduce_sum(embedded, 1)
        second_order = 0.5 * tf.reduce_sum(
            tf.square(summed) - tf.reduce_sum(tf.square(embedded), 1), 1)
        deep_weights = tf.compat.v1.get_variable("deep", [FIELDS * 4, 8])
        out_weights = tf.compat.v1.get_variable("out", [8, 1])
        deep = tf.nn.relu(tf.matmul(tf.reshape(embedded, [-1, FIELDS * 4]), deep_weights))
        logit = (first_order + second_order)[:, None] + tf.matmul(deep, out_weights)
        out = tf.sigmoid(logit, name="out_probability")
        loss = tf.compat.v1.losses.log_loss(label, out)
        tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss, name="optimizer")
    return graph


def _rows(rng: np.random.RandomState, count: int):
    index = rng.randint(0, IDS_PER_FIELD, (count, FIELDS)) + np.arange(FIELDS) * IDS_PER_FIELD
    return index, rng.rand(count, FIELDS).astype(np.float32), rng.randint(0, 2, (count, 1))


def fit(run, graph: tf.Graph, steps: int) -> int:
    """DeepFM's fit() loop through `run` (a session's or a runner's): a training step fetches
    (loss, optimizer) on BATCH rows; every EVALUATE_EVERY steps the loss and predictions of
    EVALUATION_PASSES x EVALUATION_ROWS rows are evaluated. The training steps taken."""
    tensor = graph.get_tensor_by_name
    feeds = [tensor("feat_index:0"), tensor("feat_value:0"), tensor("label:0")]
    fetches = [tensor("log_loss/value:0"), graph.get_operation_by_name("optimizer")]
    rng = np.random.RandomState(1)
    evaluated = _rows(rng, EVALUATION_ROWS * EVALUATION_PASSES)
    trained = 0
    for step in range(steps):
        run(fetches, dict(zip(feeds, _rows(rng, BATCH))))
        trained += 1
        if (step + 1) % EVALUATE_EVERY == 0:
            for start in range(0, len(evaluated[0]), EVALUATION_ROWS):
                run([fetches[0], tensor("out_probability:0")],
                    {fed: rows[start:start + EVALUATION_ROWS]
                     for fed, rows in zip(feeds, evaluated)})
    return trained


if __name__ == "__main__":
    resources, run_option, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tf.compat.v1.disable_eager_execution()
    built = build()
    runner = parallax.get_runner(built, resources, parallax.Config(run_option=run_option))
    fit(runner.run, built, steps)
    runner.close()
    print(f"worker {runner.worker_id}: trained {steps} steps", flush=True)
