"""The planner prices a dynamic embedding's ids: each worker's step sends its distinct ids to the
servers that own them and gets their rows back (8 bytes an id each way), which a static table
of the same rows does not; AUTO plans a graph with a table without trials, and the plan CLI's
answer gives every run option's plan but AR's, which it says is refused."""
import dataclasses

import tensorflow as tf

import parallax
from parallax import contracts
from parallax import plan as cli
from parallax.config import PlanOptions
from parallax.planning import cost
from parallax.planning.analysis import analyze
from parallax.planning.cost import ALLREDUCE, PS, Method, Shape, VariableStats, link_bytes
from parallax.planning.measure import measure
from parallax.planning.planner import measure_and_decide
from parallax.planning.problem import Problem
from parallax.planning.proposal import by_rule, propose
from parallax.planning.query import Answer, report

TWO_BY_TWO = Shape(machines=2, workers_per_machine=2)
DENSE = VariableStats("w", nbytes=1000)
# 10 gradient rows a worker (16 bytes of values, 8 of index each); distinct ids in the
# batches of 1, 2, 3, 4 workers: 6, 9, 12, 14.
ROWS = VariableStats("e", nbytes=100 * 16, rows=10, row_bytes=16, index_bytes=8,
                     unique=(6, 9, 12, 14), table_rows=100)


def _link_bytes(proposal):
    """Per machine, [sent, received] in a step of the proposal's plan."""
    traffic = [[0.0, 0.0] for _ in range(TWO_BY_TWO.machines)]
    for name, method in proposal.methods.items():
        for mine, its in zip(traffic, link_bytes(proposal.stats[name], method, TWO_BY_TWO)):
            mine[0] += its[0]
            mine[1] += its[1]
    return traffic


def test_a_tables_ids_go_to_their_owners_and_their_rows_come_back():
    variables = {"e": ROWS, "w": DENSE}
    static = by_rule(Problem(variables, TWO_BY_TWO, run_option="HYBRID", split=True,
                             splittable=("e",)))
    dynamic = by_rule(Problem(variables, TWO_BY_TWO, run_option="HYBRID",
                              tables=frozenset({"e"})))
    assert dynamic.methods == static.methods == {
        "w": Method(ALLREDUCE), "e/part_0": Method(PS, (0,)), "e/part_1": Method(PS, (1,))}
    # Each worker's 6 distinct ids, 3 a part: a machine's 2 workers send the 3 the other
    # machine owns and get their rows back (48 bytes each way), and it answers the other
    # machine's for its own part (48 more each way).
    extra = [[d - s for d, s in zip(*machine)]
             for machine in zip(_link_bytes(dynamic), _link_bytes(static))]
    assert extra == [[96.0, 96.0], [96.0, 96.0]]
    assert dynamic.stats["e/part_1"].id_bytes == cost.ID_BYTES
    # Before the compute: the step waits for them.
    assert cost.link_phases(dynamic.stats["e/part_0"], dynamic.methods["e/part_0"],
                            TWO_BY_TWO)[0] == [[2 * (48 + 24), 2 * 24], [2 * 24, 2 * (48 + 24)]]
    assert dynamic.step > static.step


def test_auto_prices_the_ids_of_the_plan_it_chooses():
    problem = Problem({"e": ROWS, "w": DENSE}, TWO_BY_TWO, tables=frozenset({"e"}))
    chosen = propose(problem)
    assert chosen.methods["e/part_0"] == Method(PS, (0,))
    assert chosen.methods["e/part_1"] == Method(PS, (1,))
    assert {name: stats.id_bytes for name, stats in chosen.stats.items()} == {
        "w": 0, "e/part_0": cost.ID_BYTES, "e/part_1": cost.ID_BYTES}
    # The same rows as a static table, split alike, cost a step the ids less.
    static = propose(dataclasses.replace(problem, tables=frozenset(), split=True,
                                         splittable=("e",)))
    assert chosen.step > static.step


def _graph():
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.constant([[1, 2], [3, 1], [70, 2], [5, 8]], tf.int64)
        table = parallax.dynamic_embedding("user", dim=4, capacity=64)
        weight = tf.compat.v1.get_variable("weight", [8, 1])
        loss = tf.reduce_sum(tf.matmul(tf.reshape(table.lookup(ids), [-1, 8]), weight))
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
    return graph


def test_auto_plans_a_graph_with_a_table_from_its_measured_rows_without_trials():
    graph = _graph()
    decision = measure_and_decide(graph, analyze(graph), [2, 2], run_option="AUTO")
    assert decision.methods["user/embedding/part_0"] == Method(PS, (0,))
    assert decision.methods["user/embedding/part_1"] == Method(PS, (1,))
    assert decision.splits == {"user/embedding": 2}
    # A worker's batch of 4 x 2 ids, 6 of them distinct: each part priced for half of them.
    part = decision.stats["user/embedding/part_0"]
    assert (part.rows, part.distinct(1), part.id_bytes) == (4, 3, cost.ID_BYTES)
    assert not decision.alternatives
    assert decision.note.endswith("not timed on the cluster: a plan's dynamic embedding "
                                  "('user') keeps its keys on that plan's servers, which the "
                                  "next plan would start without")


def test_the_plan_clis_answer_refuses_ar_and_prices_every_other_plans_parts():
    graph = _graph()
    analysis = analyze(graph)
    measured = measure(graph, analysis, [2, 2], cost.Links(bandwidth=1.25e8))
    answer = report(graph, analysis, measured, PlanOptions(), None, 4, None, links_given=True)
    assert answer.plans["AR"].methods == {}
    assert answer.plans["AR"].refused.startswith(
        "dynamic embedding 'user': run option AR keeps every variable on the workers")
    for name in ("PS", "HYBRID", "AUTO"):
        assert answer.plans[name].methods["user/embedding/part_1"] == Method(PS, (1,))
        assert answer.plans[name].step_ms > 0
    assert contracts.from_wire(Answer, contracts.to_wire(answer)) == answer  # its --json
    lines = cli.text(answer, "tables.py").splitlines()
    assert lines[-1].startswith("AR: refused: dynamic embedding 'user'")
    assert [line.split()[-1] for line in lines if line.startswith("AR ")] == ["refused"]
