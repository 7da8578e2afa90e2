"""AUTO's trials, the runner's bookkeeping in-process (the switches themselves, which carry
the training from one session to another, are tested by the AUTO jobs of test_equivalence)."""
import numpy as np

from parallax.runtime import trials


class _Runner:
    """Stands for a plan's ParallaxRunner: its runs' seconds, and how it was closed."""

    def __init__(self, seconds):
        self.seconds, self.closed, self.runs = seconds, None, 0
        self.last_run = (False, 0.0)

    def run(self, *_):
        self.runs += 1
        self.last_run = (True, self.seconds)
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
                                lambda _, candidate: kept.append(candidate), 0.0)
    runner._switch = lambda index: (switches.append(index), setattr(runner, "_index", index))
    return runner, candidates


def test_each_plan_trains_its_steps_then_the_fastest_is_kept(monkeypatch):
    monkeypatch.setattr(trials, "WARMUP_STEPS", 1)
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


def test_the_chiefs_timings_decide_on_every_worker():
    """The agreement (Horovod's broadcast from rank 0) replaces this worker's medians."""
    switches, kept = [], []
    candidates = [trials.Candidate(f"plan {i}", None, _Runner(s))
                  for i, s in enumerate([0.01, 0.02])]
    runner = trials.TrialRunner(candidates, 3, lambda values: np.array([0.05, 0.02]),
                                lambda _, candidate: kept.append(candidate), 0.0)
    runner._switch = lambda index: (switches.append(index), setattr(runner, "_index", index))
    for _ in range(6):
        runner.run("train")
    assert kept == [candidates[1]] and [c.measured for c in candidates] == [0.05, 0.02]
