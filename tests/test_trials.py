"""AUTO's trials, the runner's bookkeeping in-process (the switches themselves, which carry
the training from one session to another, are tested by the AUTO jobs of test_equivalence)."""
import numpy as np

from parallax.planning import trial_policy as policy
from parallax.runtime import trials


class _Runner:
    """Stands for a plan's ParallaxRunner: the seconds of its runs (a number, or a function of
    how many it ran before), and how it was closed."""

    def __init__(self, seconds):
        self.seconds = seconds if callable(seconds) else lambda _: seconds
        self.closed, self.runs = None, 0
        self.last_run = (False, 0.0)

    def run(self, *_):
        self.last_run = (True, self.seconds(self.runs))
        self.runs += 1
        return self.runs

    def close(self):
        self.closed = "saved"

    def close_after_trial(self):
        self.closed = "not saved"

    def describe(self):
        return "plan"


def _trial_runner(seconds, switches, kept, steps=3, agree=lambda values: values, quiet=None):
    candidates = [trials.Candidate(f"plan {i}", None, _Runner(s)) for i, s in enumerate(seconds)]
    runner = trials.TrialRunner(candidates, steps, agree,
                                lambda _, candidate: kept.append(candidate), 0.0, quiet)
    runner._switch = lambda index: (switches.append(index), setattr(runner, "_index", index))
    return runner, candidates


def test_the_schedule_warms_each_plan_then_times_it_in_two_passes_the_second_reversed():
    turns = [(t.index, t.steps, t.timed) for t in policy.schedule(3, 30)]
    assert turns == [(0, 10, False), (0, 10, True), (1, 10, False), (1, 10, True),
                     (2, 10, False), (2, 10, True), (2, 10, True), (1, 10, True), (0, 10, True)]
    assert [(t.index, t.steps, t.timed) for t in policy.schedule(2, 3)] == [
        (0, 1, False), (0, 1, True), (1, 1, False), (1, 1, True), (1, 1, True), (0, 1, True)]


def test_the_policy_keeps_and_compares_with_the_cost_model():
    assert policy.measured([0.030, 0.010]) == 0.020
    assert policy.keep([0.012, 0.010, 0.011]) == 1
    # measured / predicted: 1.5, 2.0 and a plan not predicted
    assert policy.model_ratio([0.010, 0.005, None], [0.015, 0.010, 0.020]) == 1.75
    assert policy.model_ratio([None], [0.02]) is None


def test_after_the_trials_describe_gives_predictions_corrected_by_the_measured_steps():
    switches, kept = [], []
    candidates = [trials.Candidate(f"plan {i}", predicted, _Runner(seconds))
                  for i, (predicted, seconds) in enumerate([(0.010, 0.015), (0.005, 0.010)])]
    runner = trials.TrialRunner(candidates, 3, lambda values: values,
                                lambda _, candidate: kept.append(candidate), 0.0)
    runner._switch = lambda index: (switches.append(index), setattr(runner, "_index", index))
    assert "corrected" not in runner.describe()  # not before the trials end
    for _ in range(6):
        runner.run("train")
    text = runner.describe()
    assert "plan 0: predicted 10.0 (corrected 17.5) ms, measured 15.0 ms" in text
    assert "plan 1: predicted 5.0 (corrected 8.8) ms, measured 10.0 ms" in text
    assert "measured / predicted 1.75" in text


def test_each_plan_trains_its_turns_then_the_fastest_is_kept():
    switches, kept = [], []
    runner, candidates = _trial_runner([0.03, 0.01, 0.02], switches, kept)
    for _ in range(9):  # a step each to warm up and one timed, then one more in reverse
        assert not runner.settled
        runner.run("train")
    assert runner.settled and kept == [candidates[1]]
    assert switches == [1, 2, 1, 0, 1]  # C's two turns in a row; kept: back to plan 1
    assert [c.runner.runs for c in candidates] == [3, 3, 3]
    assert [c.measured for c in candidates] == [0.03, 0.01, 0.02]
    assert [c.turns for c in candidates] == [[0.03] * 2, [0.01] * 2, [0.02] * 2]
    assert [c.runner.closed for c in candidates] == ["not saved", None, "not saved"]
    runner.run("train")
    assert candidates[1].runner.runs == 4  # the kept plan trains on
    assert "plan 1: predicted - ms, measured 10.0 ms (turns 10.0, 10.0) kept" in (
        runner.describe())
    runner.close()
    assert candidates[1].runner.closed == "saved"


def test_the_plan_timed_first_does_not_win_for_being_first():
    """The machine gets 1% slower every step, and plan 1 is 3% faster than plan 0. Timed
    early and late, plan 0's turns average what plan 1's do, and plan 1 is kept. Timed in one
    block each, the first half of each untimed (the trials before), plan 0 would have been
    kept for running first (11.0 against 11.8 ms)."""
    job = []

    def drifting(speed):
        def seconds(_):
            job.append(speed)
            return speed * (1 + 0.01 * len(job))
        return seconds
    switches, kept = [], []
    runner, candidates = _trial_runner([drifting(0.0100), drifting(0.0097)], switches, kept,
                                       steps=12)
    for _ in range(24):
        runner.run("train")
    assert kept == [candidates[1]]
    assert candidates[1].measured < candidates[0].measured


def test_a_script_ending_in_the_trials_saves_only_the_plan_in_use():
    switches, kept = [], []
    runner, candidates = _trial_runner([0.03, 0.01], switches, kept)
    for _ in range(3):
        runner.run("train")
    assert switches == [1] and not runner.settled
    runner.close()
    assert [c.runner.closed for c in candidates] == ["not saved", "saved"]


def test_the_chiefs_timings_decide_on_every_worker():
    """The agreement (Horovod's broadcast from rank 0) replaces this worker's medians."""
    switches, kept = [], []
    runner, candidates = _trial_runner([0.01, 0.02], switches, kept,
                                       agree=lambda values: np.array([0.05, 0.02]))
    for _ in range(8):
        runner.run("train")
    assert kept == [candidates[1]] and [c.measured for c in candidates] == [0.05, 0.02]


def _quiet_trials(seconds, idle, steps=3):
    """A trial runner whose candidates' steps use Horovod or not (`idle`), with its events:
    ("switch", index), "leave", "join", ("kept", name)."""
    events = []
    candidates = [trials.Candidate(f"plan {i}", None, _Runner(s)) for i, s in enumerate(seconds)]
    quiet = trials.Quiet(idle, lambda: events.append("leave") or True,
                         lambda: events.append("join"))
    runner = trials.TrialRunner(candidates, steps, lambda values: values,
                                lambda _, c: events.append(("kept", c.name)), 0.0, quiet)
    runner._switch = lambda index: (events.append(("switch", index)),
                                    setattr(runner, "_index", index))
    for _ in range(len(policy.schedule(len(seconds), steps))):
        runner.run("train")
    return runner, candidates, events


def test_a_plan_whose_steps_use_no_horovod_is_timed_without_it():
    """Left for its turns, joined again before the next switch and before the agreement, both
    collectives; once kept, the worker leaves Horovod for it (worker.py)."""
    runner, candidates, events = _quiet_trials([0.03, 0.01], [False, True])
    assert events == [("switch", 1), "leave", "join", ("switch", 0), ("switch", 1),
                      ("kept", "plan 1")]
    assert [c.quiet for c in candidates] == [False, True]
    assert "plan 1 10.0 ms a step (turns 10.0, 10.0) without Horovod" in (
        trials.describe_kept(runner, candidates[1]))
    # the first plan quiet: left at the start and for its last turn
    _, _, events = _quiet_trials([0.01, 0.02], [True, False])
    assert events == ["leave", "join", ("switch", 1), ("switch", 0), "leave", "join",
                      ("kept", "plan 0")]


def test_a_trial_stays_in_horovod_where_another_runner_uses_it():
    candidates = [trials.Candidate(f"plan {i}", None, _Runner(s)) for i, s in enumerate([1, 2])]
    joins = []
    quiet = trials.Quiet([True, True], lambda: False, lambda: joins.append("join"))
    runner = trials.TrialRunner(candidates, 3, lambda values: values, lambda *_: None, 0.0,
                                quiet)
    runner._switch = lambda index: setattr(runner, "_index", index)
    for _ in range(8):
        runner.run("train")
    assert runner.settled and not joins and not any(c.quiet for c in candidates)


class _Session:
    """A plan's graph and session, as carry reads them off a runner."""

    def __init__(self, dataset_fn):
        import tensorflow as tf

        from parallax.runtime.input_position import Iterators

        self.transformed_graph = tf.Graph()
        with self.transformed_graph.as_default():
            iterator = tf.compat.v1.data.make_one_shot_iterator(dataset_fn())
            self.next = iterator.get_next()
        self.input_iterators = Iterators(self.transformed_graph)
        self.session = tf.compat.v1.Session(graph=self.transformed_graph)


def test_an_iterator_goes_on_in_the_next_plan_where_it_stopped(tmp_path):
    import tensorflow as tf

    def dataset():
        return tf.data.Dataset.range(100).shuffle(10, seed=1).batch(3)
    old, new, single = _Session(dataset), _Session(dataset), _Session(dataset)
    expected = [single.session.run(single.next).tolist() for _ in range(4)]
    seen = [old.session.run(old.next).tolist() for _ in range(2)]
    trials._carry_iterators(old, new, str(tmp_path / "iterators"))
    assert seen + [new.session.run(new.next).tolist() for _ in range(2)] == expected


def test_an_iterator_whose_state_cannot_be_saved_is_named(tmp_path):
    import pytest
    import tensorflow as tf

    from parallax.errors import ParallaxError

    def dataset():
        return tf.data.Dataset.from_generator(lambda: iter(range(10)), tf.int64)
    old, new = _Session(dataset), _Session(dataset)
    old.session.run(old.next)
    with pytest.raises(ParallaxError, match="the position of the input iterator .*: "
                                            "GeneratorDataset does not support checkpointing.; "
                                            r"it cannot be carried to the next plan: use "
                                            r"Config\(trial_steps=0"):
        trials._carry_iterators(old, new, str(tmp_path / "iterators"))
