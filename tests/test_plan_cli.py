"""`python -m parallax.plan`: what each run option's plan would cost on a cluster that does not
exist, from the script's graph measured on this machine (tf.data input, or the feeds of the
script's own first steps), built by the planner's parts."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO, load_workload
import parallax
from parallax import contracts, driver, launch
from parallax import plan as cli
from parallax.config import Config, PlanOptions
from parallax.planning import cost, proposal
from parallax.planning.analysis import analyze
from parallax.planning.measure import input_batch, measure
from parallax.planning.query import Answer, Batch, FedSteps, report


def _plan(*argv):
    result = subprocess.run([sys.executable, "-m", "parallax.plan", *argv], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    return result.returncode, result.stdout, result.stderr


def _check_plans(answer, workers, batch):
    """What holds of every answer: each plan's terms sum to its step, the largest bounds it,
    the throughput is the combined batch over the step, and AUTO gives its margin over each
    rule's plan it would time on the cluster."""
    plans = answer.plans
    assert list(plans) == ["AR", "PS", "HYBRID", "AUTO"]
    assert answer.batch == Batch(per_worker=batch, combined=batch * workers)
    for plan in plans.values():
        assert math.isclose(sum(plan.terms_ms.values()), plan.step_ms, rel_tol=1e-9)
        assert plan.bound_by == max(plan.terms_ms, key=plan.terms_ms.get)
        assert math.isclose(plan.examples_per_second, batch * workers / plan.step_ms * 1e3)
        assert plan.busiest_link_bytes.sent > 0
    auto = plans["AUTO"]
    timed = [rule.step_ms for rule in (auto.rules or {}).values() if rule.timed]
    # AUTO keeps the fastest of the plans it times: the prediction is the fastest predicted
    assert auto.step_ms <= min(timed, default=auto.step_ms)
    assert auto.step_ms <= plans["AR"].step_ms


def _answer(printed: str) -> Answer:
    """The answer --json printed, typed; printed again as the command prints it."""
    answer = contracts.from_wire(Answer, json.loads(printed))
    assert json.dumps(contracts.to_wire(answer), indent=1) == printed.rstrip("\n")
    return answer


@pytest.mark.job
def test_the_cli_answers_for_a_fed_script_and_a_tf_data_one_and_says_why_it_cannot(tmp_path):
    # word2vec feeds its batches: the measurement reads its first 32 steps' feeds.
    code, out, err = _plan("examples/word2vec.py", "--machines", "8", "--workers-per-machine",
                           "4", "--link", "10gbit", "--cores", "4", "--json")
    assert code == 0, err[-3000:]
    answer = _answer(out)
    assert answer.cluster.machines == 8 and answer.cluster.workers_per_machine == 4
    assert answer.cluster.link.bandwidth == 1.25e9
    assert answer.terms.compute == "measured on this machine"
    assert answer.fed == FedSteps(training_steps=32, other_runs=0, workers=32)
    _check_plans(answer, 32, 64)
    tables = {v.name: v for v in answer.variables}
    assert {v.kind for v in tables.values()} == {"sparse"}
    assert all(0 < v.alpha <= 1 and v.rows_per_worker >= 64 for v in tables.values())
    plans = answer.plans
    assert {m.how for m in plans["AR"].methods.values()} == {cost.ALLGATHER}
    for rule in ("PS", "HYBRID"):  # the rule as a job runs it: one server each, by bytes
        assert set(plans[rule].methods) == set(tables)
        assert all(len(m.servers) == 1 for m in plans[rule].methods.values())
    # a rule's plan is timed unless predicted slower by more than the model errs
    for rule in (plans["AUTO"].rules or {}).values():
        assert rule.timed is (rule.margin <= proposal.TRUSTED_MARGIN)
    assert "transport probed: a message" in plans["AUTO"].note
    assert answer.terms.transport is not None

    # classifier reads tf.data; its step given as a GPU's: compute is 5 ms, the cores unshared.
    code, out, err = _plan("examples/classifier.py", "--machines", "2",
                           "--workers-per-machine", "2", "--link", "100mbit", "--step-ms", "5")
    assert code == 0, err[-3000:]
    assert "2 machines x 2 workers, links 100 Mbit/s and 200 us a message (given)" in out
    assert "compute (given (--step-ms)): one worker's step alone 5 ms" in out
    assert "batch: 32 examples a worker, 128 combined" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("plan "))
    assert [line.split()[0] for line in lines[header + 1:header + 5]] == [
        "AR", "PS", "HYBRID", "AUTO"]
    assert "AUTO: cost model: 2 machines x 2 workers" in out

    script = tmp_path / "no_runner.py"
    script.write_text("print('trained without Parallax')\n")
    code, _, err = _plan(str(script), "--machines", "2", "--workers-per-machine", "1",
                         "--link", "1gbit")
    assert code == cli.NOT_ANSWERED
    assert "not answered: the script ended without calling parallax.get_runner" in err


@pytest.mark.parametrize("steps", [6, 3], ids=["long-loop", "short-loop"])
def test_a_fed_script_is_measured_on_its_training_steps_not_its_evaluation_runs(
        tmp_path, monkeypatch, steps):
    """DeepFM's fit() loop (issue 69) as its author wrote it: evaluation passes of 256 rows
    fetch the loss and predictions between training steps of 8 rows, on the same feeds. The
    rows a worker's batch touches are a training step's, 8 x 39 (the evaluations' averaged in
    made them 5148), and the script ends at its 4th training step, not inside an evaluation;
    a loop of 3 steps has its feeds reused in turn, and the answer says so."""
    click_through = load_workload("click_through")
    # The probes of this machine's transport and collectives: not what is tested, and slow.
    monkeypatch.setattr(launch, "probe_transport", lambda *args: None)
    monkeypatch.setattr(launch, "probe_collectives", lambda *args: None)
    graph = click_through.build()
    out = tmp_path / "answer.json"
    query = contracts.PlanQuery(str(out), machines=2, workers_per_machine=2, bandwidth=1.25e8)
    runner = driver.answer(graph, analyze(graph), Config(run_option="AUTO"), query)
    trained = []
    with pytest.raises(SystemExit) as ended:
        trained.append(click_through.fit(runner.run, graph, steps))
        runner.close()
    assert ended.value.code == 0 and trained == ([] if steps > 4 else [steps])
    written = json.loads(out.read_text())
    # one evaluation (3 passes) after the second step; the fourth step ends a long loop
    assert written["fed"] == {"training_steps": min(steps, 4), "other_runs": 3, "workers": 4}
    answer = contracts.from_wire(Answer, written)
    touched = click_through.BATCH * click_through.FIELDS
    for table in ("feature_embeddings", "feature_bias"):
        shown = next(v for v in answer.variables if v.name == table)
        assert shown.rows_per_worker == touched, shown
    assert answer.batch == Batch(per_worker=click_through.BATCH,
                                 combined=4 * click_through.BATCH)
    said = cli.text(answer, "click_through.py")
    assert ("its first 4 training steps' feeds, one a worker" if steps > 4 else
            "its 3 training steps' feeds, reused in turn for 4 workers") in said
    assert "3 runs between them fetched no training op (an evaluation's) and are not counted" \
        in said


def test_the_report_of_a_tf_data_graph_prices_every_run_option_by_its_rule_or_search():
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.data.make_one_shot_iterator(parallax.shard(
            tf.data.Dataset.from_tensor_slices(np.arange(4096) % 500).batch(64))).get_next()
        table = tf.compat.v1.get_variable("table", [500, 32])
        dense = tf.compat.v1.get_variable("dense", [32, 8])
        loss = tf.reduce_sum(tf.matmul(tf.nn.embedding_lookup(table, ids), dense))
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    analysis = analyze(graph)
    measured = measure(graph, analysis, [2] * 4, cost.Links(bandwidth=1.25e8))
    batch, why = input_batch(graph)
    assert (batch, why) == (64, None)
    answer = report(graph, analysis, measured, PlanOptions(), None, batch, None,
                    links_given=True)
    _check_plans(answer, 8, 64)
    plans = answer.plans
    assert plans["AR"].methods["table"].how == cost.ALLGATHER
    assert plans["HYBRID"].methods["table"] == cost.Method(cost.PS, (0,))
    assert plans["PS"].methods["dense"].how == cost.PS
    assert "links assumed: 1 Gbit/s" in plans["AUTO"].note
    assert answer.cluster.link_measured is False
    written = contracts.to_wire(answer)  # what --json prints
    assert written["plans"]["HYBRID"]["methods"]["table"] == {"how": "parameter server",
                                                              "servers": [0]}
    assert contracts.from_wire(Answer, written) == answer


def test_the_cli_refuses_what_it_cannot_ask(capsys):
    assert cli.rate("10gbit") == cli.rate("10Gbit/s") == 1.25e9
    assert cli.rate("1.25GB/s") == 1.25e9 and cli.rate("100Mb") == 12.5e6
    for wrong in (["examples/word2vec.py", "--machines", "2"],
                  ["examples/word2vec.py", "--machines", "2", "--workers-per-machine", "1",
                   "--link", "fast"],
                  ["no-such-script.py", "--resources", "localhost"],
                  ["examples/word2vec.py", "--machines", "0", "--workers-per-machine", "1",
                   "--link", "1gbit"]):
        with pytest.raises(SystemExit) as exit_:
            cli.parse(wrong)
        assert exit_.value.code == 2
    said = capsys.readouterr().err
    assert "give the cluster: --machines, --workers-per-machine and --link" in said
    assert "'fast' is not a rate" in said
    assert "SCRIPT 'no-such-script.py' is not a file" in said
    assert "must be at least 1, got 0" in said
    options, script, arguments = cli.parse(
        ["examples/word2vec.py", "localhost", "--machines", "8", "--workers-per-machine", "4",
         "--link", "100mbit", "--", "--json"])
    assert (script, arguments, options.json) == ("examples/word2vec.py", ["localhost", "--json"],
                                                 False)
