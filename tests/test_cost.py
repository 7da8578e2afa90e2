"""The cost model (the planner's rating), and the proposal's search by it, against figures worked
out by hand (2 machines x 2 workers unless said)."""
import dataclasses
import re

import pytest

from parallax.planning import cost
from parallax.planning import explanation, proposal
from parallax.planning.candidates import balance_by_bytes
from parallax.planning.cost import (ALLGATHER, ALLREDUCE, MACHINE_STAGES_SECONDS, PS, Links,
                                    Method, Shape, VariableStats, compute_and_pushes, link_bytes,
                                    link_phases, machine_stages_pay, server_updates,
                                    shared_compute, step_time, waits)
from parallax.planning.problem import Compute, Problem

TWO_BY_TWO = Shape(machines=2, workers_per_machine=2)


def _problem(stats, shape, links, summable=None, off_servers=(), machine_stages=None):
    """The problem of these variables alone: every sparse one summable unless said."""
    summable = [v.name for v in stats if v.sparse] if summable is None else summable
    return Problem({v.name: v for v in stats}, shape, links=links, summable=frozenset(summable),
                   off_servers=frozenset(off_servers), machine_stages=machine_stages)


def search(stats, shape, links, shard_counts=None, summable=None, hows=None, off_servers=()):
    """The proposal's search with allreduce in one ring."""
    return proposal.search(_problem(stats, shape, links, summable, off_servers),
                           shard_counts or {}, hows or {}, False)


def fastest(stats, shape, links, machine_stages=None):
    """The proposal's plan of a ring or of machine stages, and which."""
    return proposal.fastest(_problem(stats, shape, links, machine_stages=machine_stages), {}, {})
DENSE = VariableStats("w", nbytes=1000)
# 10 gradient rows a worker (16 bytes of values, 8 of index each); distinct ids in the
# batches of 1, 2, 3, 4 workers: 6, 9, 12, 14.
SPARSE = VariableStats("e", nbytes=100 * 16, rows=10, row_bytes=16, index_bytes=8,
                       unique=(6, 9, 12, 14))


def test_allreduce_moves_twice_the_variable_less_one_share_each_way():
    assert link_bytes(DENSE, Method(ALLREDUCE), TWO_BY_TWO) == [[1500.0, 1500.0]] * 2


def test_allreduce_in_machine_stages_crosses_each_link_as_a_ring_of_machines():
    # 2w(H-1)/H = 1000 each way, not 1500; with one worker a machine, the same as a ring.
    assert link_bytes(DENSE, Method(ALLREDUCE), TWO_BY_TWO,
                      hierarchical_allreduce=True) == [[1000.0, 1000.0]] * 2
    four = Shape(machines=4, workers_per_machine=1)
    assert (link_bytes(DENSE, Method(ALLREDUCE), four, hierarchical_allreduce=True)
            == link_bytes(DENSE, Method(ALLREDUCE), four, hierarchical_allreduce=False))


def test_machine_stages_pay_when_the_bytes_saved_outweigh_two_horovod_cycles():
    # 2 x 2 at 12.5 MB/s: a ring saves w/2 a link direction, 10 ms is 125 kB, so w > 250 kB.
    assert not machine_stages_pay(240e3, TWO_BY_TWO, Links())
    assert machine_stages_pay(260e3, TWO_BY_TWO, Links())
    assert not machine_stages_pay(1e9, Shape(machines=4, workers_per_machine=1), Links())


def test_a_step_in_machine_stages_pays_two_horovod_cycles_more():
    # 1 MB: 80 ms of link, 6 messages of 0.2 ms in sequence (a ring's), and 10 ms of cycles.
    dense = VariableStats("w", nbytes=1_000_000)
    seconds = step_time({"w": Method(ALLREDUCE)}, {"w": dense}, TWO_BY_TWO, Links(),
                        hierarchical_allreduce=True)
    assert seconds == pytest.approx(0.080 + 6 * 200e-6 + 0.010)


def test_cheaper_allreduces_in_machine_stages_can_turn_a_sparse_table_to_allreduce():
    # Beside w's allreduce (1.5 MB a link direction in a ring, 1 MB in stages), t costs: as
    # dense 300 kB in a ring, 200 kB in stages; on a server, 2 x 3125 unique rows x 16 = 100 kB
    # of pulls, then a machine's 6250 summed rows x 24 = 150 kB of pushes; allgathered,
    # 3 x 6000 rows x 24 = 432 kB.
    dense = VariableStats("w", nbytes=1_000_000)
    table = VariableStats("t", nbytes=200_000, rows=6000, row_bytes=16, index_bytes=8,
                          unique=(3125, 6250, 9000, 12000))
    ring, staged = fastest([dense, table], TWO_BY_TWO, Links(),
                                              machine_stages=False)
    assert (ring["t"].how, staged) == (PS, False)
    # The ring's best is 1.75 MB (140 ms), the stages' 1.2 MB (96 ms, + 10 ms of cycles).
    chosen, staged = fastest([dense, table], TWO_BY_TWO, Links())
    assert (chosen["t"].how, staged) == (ALLREDUCE, True)


def test_machine_stages_are_not_chosen_for_few_allreduced_bytes_unless_asked():
    # 100 kB: 12 ms of link in a ring, 8 ms + 10 ms of cycles in stages.
    small = [VariableStats("w", nbytes=100_000)]
    assert fastest(small, TWO_BY_TWO, Links())[1] is False
    assert fastest(small, TWO_BY_TWO, Links(), machine_stages=True)[1]


def test_allgather_sends_every_workers_rows_to_every_other_worker():
    # q = 10 rows x 24 bytes = 240, from each of the 3 other workers.
    assert link_bytes(SPARSE, Method(ALLGATHER), TWO_BY_TWO) == [[720.0, 720.0]] * 2


def test_a_parameter_server_with_and_without_local_aggregation():
    # Pulls: each worker's 6 unique rows x 16 = 96; a machine's summed push: 9 rows x 24 = 216.
    aggregated = link_bytes(SPARSE, Method(PS, (0,)), TWO_BY_TWO)
    assert aggregated == [[2 * 96, 216], [216, 2 * 96]]
    plain = link_bytes(SPARSE, Method(PS, (0,)), TWO_BY_TWO, local_aggregation=False,
                       unique_pulls=False)
    assert plain == [[2 * 160, 2 * 240], [2 * 240, 2 * 160]]


def test_shards_on_every_machine_split_the_server_traffic():
    # Each machine serves half (96 out, 108 in) and is a client of the other half.
    assert link_bytes(SPARSE, Method(PS, (0, 1)), TWO_BY_TWO) == [[204, 204], [204, 204]]


def test_one_machine_moves_nothing_between_machines():
    one = Shape(machines=1, workers_per_machine=4)
    assert link_bytes(SPARSE, Method(PS, (0,)), one) == [[0.0, 0.0]]


def test_a_steps_traffic_comes_in_two_phases_pulls_then_the_rest():
    pull, push = link_phases(SPARSE, Method(PS, (0,)), TWO_BY_TWO)
    assert pull == [[2 * 96, 0], [0, 2 * 96]] and push == [[0, 216], [216, 0]]
    assert link_phases(DENSE, Method(ALLREDUCE), TWO_BY_TWO) == ([[0, 0]] * 2, [[1500] * 2] * 2)


def test_step_time_is_compute_then_each_phases_busiest_link_and_its_messages():
    links = Links(bandwidth=1000.0, latency=0.01)
    choice = {"w": Method(ALLREDUCE), "e": Method(PS, (0,))}
    stats = {"w": DENSE, "e": SPARSE}
    # The pulls: machine 0 sends 192 bytes; then the allreduce's 1500 and the summed push's
    # 216 that machine 0 receives; the allreduce's 2(N-1) = 6 messages in sequence.
    assert step_time(choice, stats, TWO_BY_TWO, links, compute=0.5) == pytest.approx(
        0.5 + (192 + 1716) / 1000 + 6 * 0.01)


def test_a_dense_gradient_pushed_to_a_server_leaves_while_the_compute_goes_on():
    """2 s of compute; w's gradient is ready after 20% of it, and its pushes take machine 1's
    link 2 s (its two workers' 1000 bytes at 1000 B/s), after the pulls' 2 s."""
    links = Links(bandwidth=1000.0, latency=0.0)
    early = VariableStats("w", nbytes=1000, ready=0.2)
    on_server = {"w": Method(PS, (0,))}
    assert step_time(on_server, {"w": early}, TWO_BY_TWO, links, compute=2.0) == (
        pytest.approx(2 + 0.4 + 2))
    assert step_time(on_server, {"w": DENSE}, TWO_BY_TWO, links, compute=2.0) == (
        pytest.approx(2 + 2 + 2))  # ready at the end (not measured)
    # Rows summed with the machine's others, and an allreduce, wait for the compute's end.
    rows = dataclasses.replace(SPARSE, ready=0.2)
    assert step_time({"e": Method(PS, (0,))}, {"e": rows}, TWO_BY_TWO, links, compute=2.0) == (
        pytest.approx(step_time({"e": Method(PS, (0,))}, {"e": SPARSE}, TWO_BY_TWO, links,
                                compute=2.0)))
    assert step_time({"w": Method(ALLREDUCE)}, {"w": early}, TWO_BY_TWO, links, compute=2.0) == (
        pytest.approx(2 + 1.5))


def test_pushes_go_in_the_order_they_are_ready_when_the_link_is_free():
    assert compute_and_pushes(1.0, []) == 1.0
    assert compute_and_pushes(1.0, [(0.5, 0.2), (0.1, 0.3)]) == pytest.approx(1.0)
    assert compute_and_pushes(1.0, [(0.1, 0.6), (0.2, 0.6)]) == pytest.approx(1.3)
    assert compute_and_pushes(1.0, [(1.0, 0.5), (0.9, 0.05)]) == pytest.approx(1.5)
    assert compute_and_pushes(0.0, [(0.3, 0.5), (1.0, 0.5)]) == pytest.approx(1.0)


def test_a_servers_update_leaves_the_workers_compute_and_follows_the_pushes():
    """Adam's update of a whole table: 40% of a worker's step. On a server it is done once,
    there, after the pushes it waits for; allreduced, on every worker inside its compute."""
    table = dataclasses.replace(SPARSE, update=0.4)
    split = dataclasses.replace(table, name="f")
    plan = {"e": Method(PS, (0,)), "f": Method(PS, (0, 1)), "w": Method(ALLREDUCE)}
    stats = {"e": table, "f": split, "w": dataclasses.replace(DENSE, update=0.1)}
    off, held = server_updates(plan, stats, TWO_BY_TWO)
    assert off == pytest.approx(0.8) and held == pytest.approx([0.6, 0.2])
    assert compute_and_pushes(1.0, [(1.0, 0.1)], off=0.4, server_seconds=0.3) == (
        pytest.approx(0.6 + 0.1 + 0.3))
    # A push ready at 90% of the step goes when the worker, its update gone, is done (60%).
    assert compute_and_pushes(1.0, [(0.9, 0.1)], off=0.4) == pytest.approx(0.7)
    links = Links(bandwidth=1e12, latency=0.0)  # the compute alone
    on_server = {"e": Method(PS, (0,))}
    assert step_time(on_server, {"e": table}, TWO_BY_TWO, links, compute=2.0) == (
        pytest.approx(2.0 * 0.6 + 2.0 * 0.4))
    # Four workers on a machine's cores take 2 s a step; the server, alone there, 0.5 s.
    assert step_time(on_server, {"e": table}, TWO_BY_TWO, links, compute=2.0, alone=0.5) == (
        pytest.approx(2.0 * 0.6 + 0.5 * 0.4))
    assert step_time({"e": Method(ALLREDUCE)}, {"e": table}, TWO_BY_TWO, links,
                     compute=2.0) == pytest.approx(2.0)


def test_waits_are_the_longest_chain_of_messages_and_the_cycles_of_machine_stages():
    links = Links(bandwidth=1000.0, latency=0.01)
    choice = {"w": Method(ALLREDUCE), "e": Method(PS, (0,))}
    stats = {"w": DENSE, "e": SPARSE}
    assert waits(choice, stats, TWO_BY_TWO, links) == pytest.approx(6 * 0.01)
    assert waits(choice, stats, TWO_BY_TWO, links, hierarchical_allreduce=True) == (
        pytest.approx(6 * 0.01 + MACHINE_STAGES_SECONDS))
    assert waits({"e": choice["e"]}, stats, TWO_BY_TWO, links,
                 hierarchical_allreduce=True) == pytest.approx(2 * 0.01)  # nothing staged


def test_workers_sharing_a_machines_cores_share_its_cpu_time():
    # Alone: 12 ms of wall time, 20 ms of CPU (its ops on 1.67 cores of 2).
    assert shared_compute(0.012, 0.020, workers_per_machine=1, cores=2) == 0.012
    assert shared_compute(0.012, 0.020, workers_per_machine=2, cores=2) == pytest.approx(0.020)
    assert shared_compute(0.012, 0.020, workers_per_machine=4, cores=2) == pytest.approx(0.040)
    # A GPU worker's CPU time (launching kernels) is small: its step alone stands.
    assert shared_compute(0.100, 0.010, workers_per_machine=8, cores=32) == 0.100


def test_a_sparse_gradient_that_is_nearly_dense_goes_to_allreduce():
    # A 1000-row vocabulary of 64 floats, 5000 ids a worker: every row is in every batch
    # (alpha = 1). Allreduce moves 2 x 256 kB x 3/4 = 384 kB a link; a server's machine would
    # send each of the other machine's two workers all 1000 rows: 512 kB.
    small_vocab = VariableStats("tags", nbytes=1000 * 256, rows=5000, row_bytes=256,
                                unique=(1000,) * 4)
    chosen = search([small_vocab, DENSE], TWO_BY_TWO, Links())
    assert chosen == {"tags": Method(ALLREDUCE), "w": Method(ALLREDUCE)}


def test_one_large_table_is_allgathered_and_two_balance_on_two_servers():
    # Alone on a server, machine 0 sends 2 workers x 900 rows (460.8 kB) in the pulls and
    # receives 1700 summed rows (448.8 kB) after: 909.6 kB in sequence; an allgather sends
    # and receives 3 workers x 1000 rows (792 kB). Two tables on two servers keep every link
    # direction as busy in each phase as one table does (909.6 kB; allgathers: 1584 kB).
    table = dict(nbytes=100_000 * 256, rows=1000, row_bytes=256, unique=(900, 1700, 2400, 3000))
    assert search([VariableStats("a", **table)], TWO_BY_TWO, Links()) == {
        "a": Method(ALLGATHER)}
    chosen = search([VariableStats("a", **table), VariableStats("b", **table)], TWO_BY_TWO,
                    Links())
    assert {m.how for m in chosen.values()} == {PS}
    assert sorted(m.servers for m in chosen.values()) == [(0,), (1,)]


def test_shards_are_chosen_when_one_table_would_load_one_machine():
    table = VariableStats("a", nbytes=100_000 * 256, rows=1000, row_bytes=256,
                          unique=(900, 1700, 2400, 3000))
    assert search([table], TWO_BY_TWO, Links(), shard_counts={"a": (1, 2)})["a"] == Method(
        PS, (0, 1))
    assert search([table], TWO_BY_TWO, Links(), shard_counts={"a": (4,)})["a"] == Method(
        PS, (0, 1, 0, 1))


def test_a_run_options_rule_restricts_the_methods_and_shards_are_still_chosen():
    # A dense variable on servers (PS's rule), 4 machines of one worker: on one server its
    # machine sends it to 3 others (3w); in 4 shards every link sends 3w/4 + 3 x w/4.
    dense = VariableStats("w", nbytes=4 << 20)
    table = VariableStats("a", nbytes=100_000 * 256, rows=1000, row_bytes=256,
                          unique=(900, 1700, 2400, 3000))
    chosen = search([dense, table], Shape(4, 1), Links(), shard_counts={"w": (1, 2, 4)},
                    hows={"w": PS, "a": ALLGATHER})
    assert chosen == {"w": Method(PS, (0, 1, 2, 3)), "a": Method(ALLGATHER)}
    # On 2 machines the split moves as many bytes, but on one server its machine's link sends
    # 2w in the pulls and receives 2w after, one direction at a time; split, both directions
    # carry w in each phase.
    assert search([dense], TWO_BY_TWO, Links(), shard_counts={"w": (1, 2)},
                  hows={"w": PS})["w"] == Method(PS, (0, 1))


def test_of_plans_equally_fast_the_fewest_shards():
    # On one machine nothing crosses a link: one shard or two, the step is as fast.
    table = VariableStats("a", nbytes=1000 * 256, rows=10, row_bytes=256, unique=(9, 17))
    assert search([DENSE, table], Shape(1, 2), Links(), shard_counts={"a": (1, 2)},
                  hows={"a": PS}) == {"w": Method(ALLREDUCE), "a": Method(PS, (0,))}


def test_tables_the_links_price_alike_are_spread_over_the_servers():
    # Four equal shards of which a batch reads few rows: every server is as fast for the
    # links; they go in turn, as HYBRID's balance by bytes puts them.
    shard = dict(nbytes=25_000 * 256, rows=100, row_bytes=256, unique=(90, 170, 240, 300))
    chosen = search([VariableStats(f"part_{i}", **shard) for i in range(4)], TWO_BY_TWO,
                    Links())
    assert [chosen[f"part_{i}"].servers for i in range(4)] == [(0,), (1,), (0,), (1,)]


def test_hybrids_rule_puts_the_largest_first_each_on_the_server_holding_least():
    assert balance_by_bytes([(f"t/{i}", 4) for i in range(4)], 2) == {
        "t/0": 0, "t/1": 1, "t/2": 0, "t/3": 1}  # a table's equal shards alternate
    assert balance_by_bytes([("big", 10), ("t/0", 4), ("t/1", 4), ("t/2", 4)], 2) == {
        "big": 0, "t/0": 1, "t/1": 1, "t/2": 1}
    # Beside a table split over servers 0 and 1 (5 bytes on each).
    assert balance_by_bytes([("x", 10)], 3, held=[5, 5, 0]) == {"x": 2}


def test_of_placements_about_as_fast_auto_keeps_hybrids(monkeypatch):
    # Shards of one table, a little apart in their unique rows: the model would rather put
    # the first two on one server (872 bytes on the busiest links, against 928 for HYBRID's
    # spread), a step 0.9% faster with the two messages' 400 us: less than the margin.
    shards = [VariableStats(f"t/part_{i}", nbytes=1600, rows=10, row_bytes=16, index_bytes=8,
                            unique=(u, u + 3, u + 6, u + 8)) for i, u in enumerate((8, 5, 6, 7))]
    chosen = search(shards, TWO_BY_TWO, Links())
    assert [chosen[v.name].servers for v in shards] == [(0,), (1,), (0,), (1,)]
    monkeypatch.setattr(proposal, "PLACEMENT_MARGIN", 0.0)
    chosen = search(shards, TWO_BY_TWO, Links())
    assert [chosen[v.name].servers for v in shards] == [(0,), (0,), (1,), (1,)]


def test_a_placement_much_faster_than_hybrids_is_kept():
    # HYBRID balances bytes held: the large, little-read table on one server and both hot
    # ones on the other, whose link then carries all their rows. The model splits the hot
    # ones.
    large = VariableStats("a", nbytes=10_000_000, rows=10, row_bytes=16, index_bytes=8,
                          unique=(10, 20, 30, 40))
    hot = [VariableStats(name, nbytes=1_000_000, rows=1000, row_bytes=16, index_bytes=8,
                         unique=(1000, 2000, 3000, 4000)) for name in "bc"]
    assert balance_by_bytes([(v.name, v.nbytes) for v in [large] + hot], 2) == {
        "a": 0, "b": 1, "c": 1}
    chosen = search([large] + hot, TWO_BY_TWO, Links())
    assert chosen["b"].servers != chosen["c"].servers


def test_hybrids_rule_is_a_candidate_that_the_beam_may_drop():
    """lm's tables in 4 shards each (TensorFlow's partitioner) on 4 machines of 1 worker, as
    the driver measured them: alone, a shard of the softmax is predicted cheaper allgathered
    than on one server, and the beam keeps allgathers (131.5 ms of communication); on the 4
    servers together the shards balance, as HYBRID places them (61.9 ms)."""
    def shards(name, nbytes, row_bytes, rows, unique):
        return [VariableStats(f"{name}/part_{j}", nbytes, rows=r, row_bytes=row_bytes,
                              unique=u) for j, (r, u) in enumerate(zip(rows, unique))]
    words = [(277, 489, 722, 923), (281, 513, 706, 886), (294, 528, 722, 900),
             (299, 516, 728, 928)]
    sampled = [483, 390, 368, 421]
    stats = (shards("embedding", 6_400_000, 256, [226, 136, 119, 157],
                    [(47, 94, 134, 173), (65, 100, 139, 176), (55, 107, 143, 179),
                     (51, 92, 125, 158)])
             + shards("softmax_w", 6_400_000, 256, sampled, words)
             + shards("softmax_b", 100_000, 4, sampled, words)
             + [VariableStats("kernel", 65536), VariableStats("recurrent", 65536),
                VariableStats("bias", 1024)])
    cluster, links = Shape(4, 1), Links()
    chosen = search(stats, cluster, links)
    seconds = cost.step_time(chosen, {s.name: s for s in stats}, cluster, links)
    assert seconds == pytest.approx(0.0619, abs=5e-4)
    assert {m.how for name, m in chosen.items() if "/part_" in name} == {PS}
    assert sorted(chosen[f"softmax_w/part_{j}"].servers[0] for j in range(4)) == [0, 1, 2, 3]


# Round numbers for the transport's costs, so that the sums can be followed by hand.
TRANSPORT = cost.Transport(message_seconds=1e-3, worker_cpu_message=1e-3,
                           server_cpu_message=2e-3, worker_cpu_byte=1e-6, server_cpu_byte=2e-6,
                           server_cpu_row=1e-4)


def test_the_synchronizations_cpu_counts_every_message_byte_and_row_at_both_ends():
    # SPARSE on server 0, local aggregation, unique pulls: a worker pulls 6 rows x 16 = 96
    # bytes; each machine pushes its 2 workers' 9 distinct rows x 24 = 216 bytes, once.
    # Server 0: 2 machines x (2 pulls + 1 push) = 6 messages (12 ms), 2 x (192 + 216) = 816
    # bytes (1.632 ms), 18 rows (1.8 ms). Each machine's workers: 3 messages (3 ms), 408
    # bytes (0.408 ms). DENSE allreduced in a ring of 4: each worker 6 messages of 250 bytes,
    # each at both ends' cost, 6 x 3 ms + 1500 x 3 us = 22.5 ms, 45 ms a machine.
    spent = cost.sync_cpu({"e": Method(PS, (0,)), "w": Method(ALLREDUCE)},
                          {"e": SPARSE, "w": DENSE}, TWO_BY_TWO, TRANSPORT)
    assert spent == pytest.approx([0.015432 + 0.003408 + 0.045, 0.003408 + 0.045])
    # SPARSE allgathered: 3 messages of 10 rows x 24 bytes to each worker, 3 x 3 ms + 720 x
    # 3 us = 11.16 ms, two workers a machine
    assert cost.sync_cpu({"e": Method(ALLGATHER)}, {"e": SPARSE}, TWO_BY_TWO,
                         TRANSPORT) == pytest.approx([0.02232, 0.02232])
    # Without local aggregation every worker pushes its 10 rows x 24 bytes: 4 pushes, 40 rows.
    apart = cost.sync_cpu({"e": Method(PS, (0,))}, {"e": SPARSE}, TWO_BY_TWO, TRANSPORT,
                          local_aggregation=False)
    assert apart[1] == pytest.approx(4 * 1e-3 + (192 + 480) * 1e-6)
    assert apart[0] == pytest.approx(apart[1] + 8 * 2e-3 + 2 * 672 * 2e-6 + 40 * 1e-4)


def test_on_shared_cores_the_cpu_floor_bounds_the_step():
    choice, stats = {"e": Method(PS, (0,))}, {"e": SPARSE}
    # Each worker computes 10 ms of CPU: 2 x 10 ms + the synchronization's, per machine.
    one_kernel = cost.CpuBudget(worker_cpu=0.01, cores=2, machines_per_kernel=2)
    assert cost.cpu_floor(choice, stats, TWO_BY_TWO, TRANSPORT, one_kernel) == pytest.approx(
        (0.03884 + 0.023408) / 2)
    own_cores = cost.CpuBudget(worker_cpu=0.01, cores=2)
    assert cost.cpu_floor(choice, stats, TWO_BY_TWO, TRANSPORT, own_cores) == pytest.approx(
        0.03884 / 2)
    terms = cost.step_terms(choice, stats, TWO_BY_TWO, Links(), compute=0.01,
                            transport=TRANSPORT, budget=one_kernel)
    assert terms["cores"] == pytest.approx(0.031124 - sum(
        seconds for term, seconds in terms.items() if term != "cores"))
    # a server's message costs the transport's where it exceeds the link's latency
    assert terms["messages"] == 2 * 1e-3
    assert "cores" not in cost.step_terms(choice, stats, TWO_BY_TWO, Links(), compute=0.01)


def test_a_probed_collective_prices_the_rings_and_gathers_at_its_own_costs():
    # DENSE allreduced in a ring of 4: each worker 6 messages (6 x 0.1 ms) and 1500 bytes
    # (1500 x 1 us); SPARSE allgathered: 3 gathers (3 x 0.5 ms) of 10 rows x 24 bytes (720 us).
    collective = cost.Collective(message_seconds=5e-4, cpu_message=1e-4, cpu_byte=1e-6,
                                 cpu_allgather=5e-4)
    spent = cost.sync_cpu({"e": Method(ALLGATHER), "w": Method(ALLREDUCE)},
                          {"e": SPARSE, "w": DENSE}, TWO_BY_TWO, TRANSPORT,
                          collective=collective)
    each = 6e-4 + 1500e-6 + 1.5e-3 + 720e-6
    assert spent == pytest.approx([2 * each, 2 * each])
    # Not probed, the transport's costs at both ends price each message and byte, as before.
    assert cost.sync_cpu({"w": Method(ALLREDUCE)}, {"w": DENSE}, TWO_BY_TWO, TRANSPORT,
                         collective=cost.Collective.over(TRANSPORT)) == pytest.approx(
        cost.sync_cpu({"w": Method(ALLREDUCE)}, {"w": DENSE}, TWO_BY_TWO, TRANSPORT))
    # A ring's message waits the probed wall time where it exceeds the link's latency.
    waits = cost.step_terms({"w": Method(ALLREDUCE)}, {"w": DENSE}, TWO_BY_TWO,
                            Links(latency=1e-4), collective=collective)["messages"]
    assert waits == pytest.approx(cost.messages(DENSE, Method(ALLREDUCE), TWO_BY_TWO) * 5e-4)


def test_where_the_whole_step_is_priced_it_chooses_among_the_search_and_the_rules():
    """On one machine communication is free, so the search allreduces a large table as
    dense; its CPU, priced in the whole step, makes a server's few rows faster: that rule's
    plan is proposed, and the search's is timed against it, named."""
    table = VariableStats("e", nbytes=4_000_000, rows=100, row_bytes=400, index_bytes=8,
                          unique=(100, 200, 300, 400), table_rows=10_000)
    base = dataclasses.replace(
        _problem([table, DENSE], Shape(machines=1, workers_per_machine=4), Links()),
        compute=Compute(alone=0.01, cpu=0.01))
    searched = proposal.propose(base)
    assert searched.methods["e"].how == ALLREDUCE and searched.chosen_rule is None
    priced = dataclasses.replace(base, transport=TRANSPORT)
    chosen = proposal.propose(priced)
    assert chosen.methods["e"].how == PS and chosen.chosen_rule in ("HYBRID's rule",
                                                                    "PS's rule")
    assert chosen.step < proposal.predicted(priced, searched.methods, searched.stats, False)
    assert proposal.SEARCHED in [a.name for a in chosen.alternatives + chosen.beyond_error]
    # where the search's plan differs, largest first
    assert re.search(r"chosen: \w+'s rule, its whole step predicted faster than the search's "
                     r"plan \(e: allreduce(, w: allreduce)?\)", explanation.note(priced, chosen))
