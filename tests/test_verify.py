"""`python -m parallax.verify`: a user's script run distributed and on one device on the same
combined batches, every variable compared. The jobs are real (tests/workloads/verified.py: tf.data
sharded with parallax.shard, an embedding on servers, dropout, Adam, a fed rate)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, WORKLOADS
import tensorflow as tf

import parallax
from parallax import contracts, verify
from parallax.runtime import input_check, recording

SCRIPT = os.path.join(WORKLOADS, "verified.py")
TWO_MACHINES = "127.0.0.1:0,1;127.0.0.2:0"


def _verify(*argv, timeout=600):
    result = subprocess.run([sys.executable, "-m", "parallax.verify", *argv], cwd=REPO,
                            capture_output=True, text=True, timeout=timeout)
    return result.returncode, result.stdout, result.stderr


def _table(stdout):
    """variable -> (max |diff|, result) of the report (whose result follows a column of one
    device's own rounding where verify measured it)."""
    lines = stdout[stdout.rindex("\nvariable "):].splitlines()[1:]
    result = 5 if "one device" in lines[0] else 4
    rows = lines[1:next(i for i, line in enumerate(lines) if line.startswith(("PASS", "FAIL")))]
    return {words[0]: (float(words[1]), words[result]) for words in map(str.split, rows)}


@pytest.mark.job
def test_a_sharded_script_with_dropout_passes_with_every_variable_listed():
    """In PS; HYBRID's run of this script, dropout and all, passes within 1e-05 in
    test_a_script_as_bert_writes_it_with_an_order_sensitive_variable_passes (and the padded
    test's), on the same machines."""
    code, out, err = _verify(SCRIPT, "localhost", "30", "--run-option", "PS",
                             "--resources", TWO_MACHINES, "--steps", "6")
    assert code == 0, out + err[-3000:]
    table = _table(out)
    assert set(table) == {"embedding", "embedding/Adam", "embedding/Adam_1", "hidden/kernel",
                          "hidden/kernel/Adam", "hidden/kernel/Adam_1", "hidden/bias",
                          "hidden/bias/Adam", "hidden/bias/Adam_1", "logits/kernel",
                          "logits/kernel/Adam", "logits/kernel/Adam_1", "beta1_power",
                          "beta2_power", "global_step"}
    assert all(result == "ok" and diff < 1e-5 for diff, result in table.values())
    assert "PASS: all 15 variables of the 3 workers within 1e-05" in out
    assert "6 training steps on " + TWO_MACHINES in out


@pytest.mark.job
def test_batches_padded_each_to_its_longest_sentence_of_strings_are_joined_as_one_device_pads():
    """padded_batch pads each worker's batch to its own longest sentence: one device gets them
    padded to the longest of all with the dataset's padding value (and the dropout drawn for
    each token, 0 where it is padding), and says so; the words are tf.string; the loss is
    divided by the batch's count of words."""
    code, out, err = _verify(SCRIPT, "localhost", "30", "--padded", "--run-option", "HYBRID",
                             "--resources", TWO_MACHINES, "--steps", "6")
    assert code == 0, out + err[-3000:]
    assert "loss divided by a sum over the batch: by the combined batch's" in out
    assert ("the workers' 'IteratorGetNext:0' of step 1 padded to (24, 9) with b'<pad>', the "
            "padding value of 'PaddedBatchDatasetV2', as one device pads the combined batch"
            in err), err[-3000:]
    assert "'IteratorGetNext:1' of step 1 padded to (24, 9) with 0, the padding value" in err
    assert ("'dropout/random_uniform/RandomUniform:0' of step 1 padded to (24, 9, 16) with 0 "
            "where they are padding" in err)
    table = _table(out)
    assert {"embedding", "hidden/kernel", "logits/kernel"} <= set(table)
    # verify's own tolerance: Adam's steps turn the sums' float order into up to ~1e-5 here
    assert all(result == "ok" for _, result in table.values())
    assert "PASS: all 12 variables of the 3 workers" in out


@pytest.mark.job
def test_a_script_as_bert_writes_it_with_an_order_sensitive_variable_passes(tmp_path):
    """As BERT's run_classifier: batches of a fixed size (drop_remainder=True) whose size the
    graph's shapes are built from, and one device's graph takes the combined batch; dropout
    drawn over batch x words rows, joined in blocks of each example's rows; variables
    initialized from a checkpoint (init_from_checkpoint: a reference variable's initializer is
    then a tensor). A bias before a batch normalization moves by Adam's rate on rounding alone:
    one device reordered is as far from itself, and verify says so beside the numbers."""
    checkpoint = _start_checkpoint(str(tmp_path / "start"))
    code, out, err = _verify(SCRIPT, "localhost", "30", "--as-bert", checkpoint,
                             "--order-sensitive", "--run-option", "HYBRID",
                             "--resources", TWO_MACHINES, "--steps", "6")
    assert code == 0, out + err[-3000:]
    assert "not within the tolerance: the one-device run again, each combined batch's " in err
    header = out[out.rindex("\nvariable "):].splitlines()[1]
    assert header.split()[-2:] == ["device", "result"], header
    rows = {line.split()[0]: line for line in out.splitlines()
            if line.startswith(("normalized/bias ", "global_step "))}
    bias = rows["normalized/bias"].split()
    assert " ".join(bias[5:]) == "within one device's own rounding (order-sensitive)", bias
    assert 0.01 < float(bias[1]) <= verify.ORDER_MARGIN * float(bias[4]), bias
    assert rows["global_step"].split()[4:] == ["-", "ok"]
    assert "PASS: all 24 variables of the 3 workers within 1e-05" in out
    assert "order-sensitive: normalized/bias" in out
    assert "NOT COMPARED" not in err


def _start_checkpoint(prefix):
    """The embedding's and the hidden kernel's values the --as-bert script starts from."""
    graph = tf.Graph()
    with graph.as_default():
        rng = np.random.RandomState(7)
        variables = [tf.compat.v1.Variable(rng.randn(*shape).astype(np.float32) * 0.2, name=name)
                     for name, shape in (("embedding", (50, 16)), ("hidden/kernel", (16, 32)))]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.variables_initializer(variables))
            return tf.compat.v1.train.Saver(variables).save(session, prefix)


@pytest.mark.job
def test_a_change_that_breaks_the_promise_fails_worst_first():
    """Gradients summed over workers, not averaged: one device's mean is not what they apply."""
    code, out, err = _verify(SCRIPT, "localhost", "30", "--run-option", "AR",
                             "--sum-gradients", "--resources", "localhost:0,1", "--steps", "4")
    assert code == 1, out + err[-3000:]
    table = _table(out)
    assert table["hidden/kernel"][1] == "FAIL" and table["hidden/kernel"][0] > 1e-3
    assert table["global_step"] == (0.0, "ok")
    results = [result for _, result in table.values()]
    assert results == sorted(results, key=lambda r: r != "FAIL")  # failures first
    assert "FAIL: " in out and " variables not within 1e-05" in out


@pytest.mark.job
def test_what_cannot_be_compared_is_said_and_is_neither_pass_nor_fail():
    code, out, err = _verify(SCRIPT, "localhost", "30", "--sampled", "--resources",
                             "localhost:0,1", "--steps", "3")
    assert code == 2 and "PASS" not in out and "FAIL" not in out
    assert ("NOT COMPARED: the step draws random numbers that are not one per example" in err
            and "LogUniformCandidateSampler" in err), err[-3000:]
    code, out, err = _verify(SCRIPT, "localhost", "30", "--padded", "--heads", "--resources",
                             "localhost:0,1", "--steps", "2")  # dropout over heads x batch
    assert code == 2 and "PASS" not in out and "FAIL" not in out
    assert ("NOT COMPARED: the step draws random numbers that are not one per example "
            "('dropout/random_uniform/RandomUniform:0', shape (16, " in err
            and "for a batch of 8" in err), err[-3000:]


@pytest.mark.job
def test_a_script_shorter_than_the_steps_asked_is_named():
    code, out, err = _verify(SCRIPT, "localhost", "2", "--run-option", "AR", "--resources",
                             "localhost:0,1", "--steps", "5")
    assert code == 2
    assert "the script ran 2 training steps, fewer than --steps 5" in err, err[-3000:]


@pytest.mark.job
def test_the_examples_classifier_passes():
    code, out, err = _verify(os.path.join(REPO, "examples", "classifier.py"), "localhost",
                             "20", "--resources", "localhost:0,1", "--steps", "5")
    assert code == 0, out + err[-3000:]
    assert "conv2d/kernel/Adam_1" in _table(out) and "PASS: all 21 variables" in out


def test_options_anywhere_and_the_scripts_own_after_a_double_dash(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    options, path, arguments = verify.parse(
        [str(script), "cluster", "--lr", "0.1", "--steps", "7", "--resources", "h:0",
         "--", "--steps", "100"])
    assert (options.steps, options.resources, path) == (7, "h:0", str(script))
    assert arguments == ["cluster", "--lr", "0.1", "--steps", "100"]
    with pytest.raises(SystemExit):  # no abbreviations: a script's --step is its own
        verify.parse([str(script), "--step", "3", "--resources", "h:0"])
    for wrong in ([str(script), "--resources", "h:0", "--steps", "0"],
                  ["missing.py", "--resources", "h:0", "--steps", "2"],
                  ["--resources", "h:0", "--steps", "2"]):
        with pytest.raises(SystemExit):
            verify.parse(wrong)


def test_each_variable_is_judged_by_its_worst_worker_and_listed_worst_first():
    one = {"w": np.array([1.0, -2.0], np.float32), "step": np.array(3),
           "bias": np.array([0.5], np.float32)}
    workers = [{"w": np.array([1.0, -2.0]), "step": np.array(3), "bias": np.array([0.5])},
               {"w": np.array([1.0, -2.001]), "step": np.array(3), "bias": np.array([0.5])}]
    rows = verify.compare(dict(one), [dict(w) for w in workers], atol=1e-5, rtol=1e-4)
    assert [r.name for r in rows] == ["w", "bias", "step"]
    worst = rows[0]
    assert (worst.passed, worst.worker) == (False, 1)
    assert worst.absolute == pytest.approx(1e-3, rel=1e-3)
    assert worst.relative == pytest.approx(5e-4, rel=1e-3)
    shaped = verify.compare({"w": np.zeros(2)}, [{"w": np.zeros(3)}], 1e-5, 1e-4)
    assert not shaped[0].passed and "shape (3,) against (2,)" in shaped[0].note
    text = verify.report(rows, "train.py", "h:0,1", 2, 5, 1e-5, 1e-4)
    assert "FAIL: 1 of 3 variables not within 1e-05 + 0.0001 x |one device| (w)" in text


def test_a_failed_variable_within_one_devices_own_rounding_passes_as_order_sensitive():
    one = {"bias": np.array([0.5, 0.1]), "w": np.array([1.0]), "step": np.array(3)}
    reordered = {"bias": np.array([0.45, 0.1]), "w": np.array([1.0]), "step": np.array(3)}
    worker = {"bias": np.array([0.35, 0.1]), "w": np.array([1.1]), "step": np.array(3)}
    rows = verify.compare(one, [worker], atol=1e-5, rtol=1e-4)
    verify.judge_order(rows, one, reordered)
    by_name = {row.name: row for row in rows}
    assert by_name["bias"].passed and by_name["bias"].order_sensitive  # 0.15 <= 4 x 0.05
    assert by_name["bias"].own == pytest.approx(0.05)
    assert not by_name["w"].passed and by_name["w"].own == 0.0  # one device is itself there
    assert [row.name for row in rows] == ["w", "bias", "step"]
    text = verify.report(rows, "train.py", "h:0,1", 1, 5, 1e-5, 1e-4)
    assert "bias" in text and "within one device's own rounding (order-sensitive)" in text
    assert "FAIL: 1 of 3 variables" in text
    rows = verify.compare(one, [dict(worker, w=np.array([1.0]))], atol=1e-5, rtol=1e-4)
    verify.judge_order(rows, one, reordered)
    assert ("PASS: all 3 variables of the 1 workers within 1e-05 + 0.0001 x |one device|, or "
            "within 4 x one device's own rounding where the order of its sums moves it (1 "
            "order-sensitive: bias)") in verify.report(rows, "t.py", "h:0", 1, 5, 1e-5, 1e-4)



def test_the_padding_value_is_found_behind_the_iterator_and_nowhere_else():
    def padded(dataset):
        return dataset.padded_batch(2, padded_shapes=([None], []),
                                    padding_values=(np.int32(-1), b"?"))

    with tf.Graph().as_default():
        words = tf.data.Dataset.from_tensor_slices(np.arange(12, dtype=np.int32).reshape(4, 3))
        pairs = words.map(lambda w: (w, tf.strings.as_string(w[0])))
        one_shot = tf.compat.v1.data.make_one_shot_iterator(
            padded(pairs).prefetch(1).repeat()).get_next()
        assert recording_found(one_shot[0]) == (-1, "PaddedBatchDatasetV2")
        assert recording_found(one_shot[1]) == (b"?", "PaddedBatchDatasetV2")
        initializable = tf.compat.v1.data.make_initializable_iterator(padded(pairs.shard(2, 0)))
        assert recording_found(initializable.get_next()[0])[0] == -1
        mapped = tf.compat.v1.data.make_one_shot_iterator(
            padded(pairs).map(lambda w, s: (w + 1, s))).get_next()
        assert recording_found(mapped[0]) == (None, None)  # the map could change the padding
        assert recording_found(tf.compat.v1.placeholder(tf.int32)) == (None, None)


def recording_found(tensor):
    value, source = input_check.padding_value(tensor)
    return (None if value is None else value.item()), source


def test_strings_are_recorded_and_read_back_without_pickle(tmp_path):
    strings = np.array([[b"", b"ab\x00"], [b"\x00", "é".encode()]], dtype=object)
    path = str(tmp_path / "step1.npz")
    recording._save(path, {"IteratorGetNext:0": strings, "ids": np.arange(3)})
    with np.load(path) as stored:  # no object arrays: np.load's default refuses pickles
        assert all(stored[name].dtype != object for name in stored.files)
    loaded = recording.load(path)
    assert set(loaded) == {"IteratorGetNext:0", "ids"}
    assert loaded["IteratorGetNext:0"].tolist() == strings.tolist()
    assert loaded["ids"].tolist() == [0, 1, 2]


def test_one_devices_fixed_size_batches_of_a_sharded_dataset_hold_the_combined_batch():
    """In verify's one-device run (3 workers), as BERT's input builds them: the batches of
    drop_remainder=True read from the sharded dataset are 3 times as large, statically; others
    are left as they are."""
    run = contracts.VerifyRun("unused", 2, contracts.ONE_DEVICE, workers=3)
    with contracts.environment(run.to_env()), tf.Graph().as_default():
        rows = tf.data.Dataset.from_tensor_slices(np.zeros((60, 4), np.float32))
        sharded = parallax.shard(rows)
        shapes = [tf.compat.v1.data.get_output_shapes(dataset).as_list() for dataset in (
            sharded.map(lambda x: x + 1).repeat().batch(8, drop_remainder=True),
            sharded.apply(tf.data.experimental.map_and_batch(lambda x: x, 8,
                                                             drop_remainder=True)),
            sharded.padded_batch(8, padded_shapes=[4], drop_remainder=True),
            sharded.batch(8), rows.batch(8, drop_remainder=True))]
    assert shapes == [[24, 4], [24, 4], [24, 4], [None, 4], [8, 4]]


def test_draws_in_blocks_of_an_examples_rows_are_told_from_draws_over_heads():
    with tf.Graph().as_default():
        words = tf.compat.v1.placeholder(tf.float32, [8, 3, 16])
        rows = tf.matmul(tf.reshape(words, [24, 16]), tf.ones([16, 16]))
        tf.nn.dropout(rows, rate=0.1)  # a static shape: the mask leads to the tensor
        dynamic = tf.compat.v1.placeholder(tf.float32, [None, 3, 16])
        tf.nn.dropout(tf.nn.relu(tf.reshape(dynamic, [-1, 16])), rate=0.1)  # Shape leads
        tf.nn.dropout(tf.concat(tf.split(words, 2, axis=2), axis=0), rate=0.1)
        draws = {name: next(op.outputs[0] for op in tf.compat.v1.get_default_graph()
                            .get_operations() if op.type == "RandomUniform"
                            and op.name.startswith(name))
                 for name in ("dropout/", "dropout_1/", "dropout_2/")}
    assert recording.examples_in_blocks(draws["dropout/"], 3)
    assert not recording.examples_in_blocks(draws["dropout/"], 2)
    assert recording.examples_in_blocks(draws["dropout_1/"], 3)
    assert not recording.examples_in_blocks(draws["dropout_2/"], 2)
