"""AUTO's trials, the runner's bookkeeping in-process (the switches themselves, which carry
the training from one session to another, are tested by the AUTO jobs of test_equivalence)."""
import numpy as np

from parallax.runtime import trials


class _Runner:
    """Stands for a plan's ParallaxRunner: its runs' seconds (a number, or one per trial of 3
    steps), and how it was closed."""

    def __init__(self, seconds):
        self.seconds = seconds if isinstance(seconds, list) else [seconds]
        self.closed, self.runs = None, 0
        self.last_run = (False, 0.0)

    def run(self, *_):
        self.runs += 1
        self.last_run = (True, self.seconds[min((self.runs - 1) // 3, len(self.seconds) - 1)])
        return self.runs

    def close(self):
        self.closed = "saved"

    def close_after_trial(self):
        self.closed = "not saved"

    def describe(self):
        return "plan"


def _trial_runner(seconds, switches, kept):
    candidates = [trials.Candidate(f"plan {i}", None, _Runner(s)) for i, s in enumerate(seconds)]
    runner = trials.TrialRunner(candidates, 3, lambda values: values,
                                lambda _, candidate: kept.append(candidate), 0.0,
                                retime_within=0.15)
    runner._switch = lambda index: (switches.append(index), setattr(runner, "_index", index))
    return runner, candidates


def test_each_plan_trains_its_steps_then_the_fastest_is_kept():
    switches, kept = [], []
    runner, candidates = _trial_runner([0.03, 0.01, 0.02], switches, kept)
    for _ in range(9):
        assert not runner.settled
        runner.run("train")
    assert runner.settled and switches == [1, 2, 1] and kept == [candidates[1]]
    assert [c.runner.runs for c in candidates] == [3, 3, 3]
    assert [c.measured for c in candidates] == [0.03, 0.01, 0.02]
    assert [c.runner.closed for c in candidates] == ["not saved", None, "not saved"]
    runner.run("train")
    assert candidates[1].runner.runs == 4  # the kept plan trains on
    assert "plan 1: predicted - ms, measured 10.0 ms kept" in runner.describe()
    runner.close()
    assert candidates[1].runner.closed == "saved"


def test_a_script_ending_in_the_trials_saves_only_the_plan_in_use():
    switches, kept = [], []
    runner, candidates = _trial_runner([0.03, 0.01], switches, kept)
    for _ in range(4):
        runner.run("train")
    assert switches == [1] and not runner.settled
    runner.close()
    assert [c.runner.closed for c in candidates] == ["not saved", "saved"]


def test_the_two_nearest_plans_are_timed_again_in_the_reverse_order():
    """Plans 1 and 2 are within 15% (Config.trial_retime_within): plan 2, in use, goes on for a second round,
    then plan 1; each keeps the mean of its rounds, and plan 1's slower second round loses."""
    switches, kept = [], []
    runner, candidates = _trial_runner([0.03, [0.010, 0.014], 0.0105], switches, kept)
    for _ in range(15):
        assert not runner.settled
        runner.run("train")
    assert runner.settled and switches == [1, 2, 1, 2] and kept == [candidates[2]]
    assert [c.runner.runs for c in candidates] == [3, 6, 6]
    assert candidates[1].rounds == [0.010, 0.014] and candidates[1].measured == 0.012
    assert candidates[2].rounds == [0.0105, 0.0105] and candidates[0].rounds == [0.03]
    assert "plan 1: predicted - ms, measured 12.0 ms (rounds 10.0 and 14.0)" in runner.describe()
    assert "plan 2 10.5 ms a step (rounds 10.5 and 10.5)" in trials.describe_kept(
        runner, candidates[2])


def test_a_second_round_that_agrees_keeps_the_plan_in_use():
    switches, kept = [], []
    runner, candidates = _trial_runner([0.0105, 0.03, 0.010], switches, kept)
    for _ in range(15):
        runner.run("train")
    # plans 2 and 0: plan 2 again (in use), then plan 0, and back to plan 2, the faster
    assert switches == [1, 2, 0, 2] and kept == [candidates[2]]
    assert [c.runner.runs for c in candidates] == [6, 3, 6]


def test_the_chiefs_timings_decide_on_every_worker():
    """The agreement (Horovod's broadcast from rank 0) replaces this worker's medians."""
    switches, kept = [], []
    candidates = [trials.Candidate(f"plan {i}", None, _Runner(s))
                  for i, s in enumerate([0.01, 0.02])]
    runner = trials.TrialRunner(candidates, 3, lambda values: np.array([0.05, 0.02]),
                                lambda _, candidate: kept.append(candidate), 0.0,
                                retime_within=0.15)
    runner._switch = lambda index: (switches.append(index), setattr(runner, "_index", index))
    for _ in range(6):
        runner.run("train")
    assert kept == [candidates[1]] and [c.measured for c in candidates] == [0.05, 0.02]


def test_no_second_round_where_retiming_is_off():
    candidates = [trials.Candidate(f"plan {i}", None, _Runner(s))
                  for i, s in enumerate([0.0105, 0.010])]
    kept = []
    runner = trials.TrialRunner(candidates, 3, lambda values: values,
                                lambda _, candidate: kept.append(candidate), 0.0,
                                retime_within=0.0)
    runner._switch = lambda index: setattr(runner, "_index", index)
    for _ in range(6):
        runner.run("train")
    assert kept == [candidates[1]] and [c.rounds for c in candidates] == [[0.0105], [0.010]]


def _quiet_trials(seconds, idle, steps=None):
    """A trial runner whose candidates' steps use Horovod or not (`idle`), with its events:
    ("switch", index), "leave", "join", ("kept", name)."""
    events = []
    candidates = [trials.Candidate(f"plan {i}", None, _Runner(s)) for i, s in enumerate(seconds)]
    quiet = trials.Quiet(idle, lambda: events.append("leave") or True,
                         lambda: events.append("join"))
    runner = trials.TrialRunner(candidates, 3, lambda values: values,
                                lambda _, c: events.append(("kept", c.name)), 0.0, quiet,
                                retime_within=0.15)
    runner._switch = lambda index: (events.append(("switch", index)),
                                    setattr(runner, "_index", index))
    for _ in range(steps or 3 * len(seconds)):
        runner.run("train")
    return runner, candidates, events


def test_a_plan_whose_steps_use_no_horovod_is_timed_without_it():
    """Left for its steps, joined again before the next switch and before the agreement, both
    collectives; once kept, the worker leaves Horovod for it (worker.py)."""
    runner, candidates, events = _quiet_trials([0.03, 0.01, 0.02], [False, True, False])
    assert events == [("switch", 1), "leave", "join", ("switch", 2), ("switch", 1),
                      ("kept", "plan 1")]
    assert [c.quiet for c in candidates] == [False, True, False]
    assert "plan 1 10.0 ms a step without Horovod" in trials.describe_kept(runner, candidates[1])
    # the first plan and the last: left at the start, joined before the agreement
    _, _, events = _quiet_trials([0.01, 0.02], [True, True])
    assert events == ["leave", "join", ("switch", 1), "leave", "join", ("switch", 0),
                      ("kept", "plan 0")]


def test_a_second_round_leaves_horovod_for_its_quiet_plan_too():
    _, candidates, events = _quiet_trials([0.0105, 0.010], [True, False], steps=12)
    assert events == ["leave", "join", ("switch", 1), ("switch", 0), "leave", "join",
                      ("switch", 1), ("kept", "plan 1")]
    assert [len(c.rounds) for c in candidates] == [2, 2]


def test_a_trial_stays_in_horovod_where_another_runner_uses_it():
    candidates = [trials.Candidate(f"plan {i}", None, _Runner(s)) for i, s in enumerate([1, 2])]
    joins = []
    quiet = trials.Quiet([True, True], lambda: False, lambda: joins.append("join"))
    runner = trials.TrialRunner(candidates, 3, lambda values: values, lambda *_: None, 0.0,
                                quiet, retime_within=0.15)
    runner._switch = lambda index: setattr(runner, "_index", index)
    for _ in range(6):
        runner.run("train")
    assert runner.settled and not joins and not any(c.quiet for c in candidates)


class _Session:
    """A plan's graph and session, as carry reads them off a runner."""

    def __init__(self, dataset_fn):
        import tensorflow as tf

        self.transformed_graph = tf.Graph()
        with self.transformed_graph.as_default():
            iterator = tf.compat.v1.data.make_one_shot_iterator(dataset_fn())
            self.next = iterator.get_next()
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
    with pytest.raises(ParallaxError, match="the position of the input iterator .* cannot be "
                                            r"carried to the next plan \(GeneratorDataset does "
                                            r"not support checkpointing.\); use Config\("
                                            "trial_steps=0"):
        trials._carry_iterators(old, new, str(tmp_path / "iterators"))
