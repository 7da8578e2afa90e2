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

from parallax import verify
from parallax.runtime import input_check, recording

SCRIPT = os.path.join(WORKLOADS, "verified.py")
TWO_MACHINES = "127.0.0.1:0,1;127.0.0.2:0"


def _verify(*argv, timeout=600):
    result = subprocess.run([sys.executable, "-m", "parallax.verify", *argv], cwd=REPO,
                            capture_output=True, text=True, timeout=timeout)
    return result.returncode, result.stdout, result.stderr


def _table(stdout):
    """variable -> (max |diff|, result) of the report."""
    lines = stdout[stdout.rindex("\nvariable "):].splitlines()[2:]
    rows = lines[:next(i for i, line in enumerate(lines) if line.startswith(("PASS", "FAIL")))]
    return {words[0]: (float(words[1]), words[4]) for words in map(str.split, rows)}


@pytest.mark.job
@pytest.mark.parametrize("run_option", ["PS", "HYBRID"])
def test_a_sharded_script_with_dropout_passes_with_every_variable_listed(run_option):
    code, out, err = _verify(SCRIPT, "localhost", "30", "--run-option", run_option,
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
