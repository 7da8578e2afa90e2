"""The search of run_option='AUTO' (and of search_partitions, split_variables): from what the
driver measured (planning/measure.py), the cost model (planning/cost.py) picks how each
variable is synchronized, on which servers, in how many shards parallax.get_partitioner's
variables are stored, and which variables the workers split. What it chose is a `Decision`,
which the plan (planning/plan.py) carries to every worker. A graph that could not be measured
(feed_dict input, say) gets its run option's rule, HYBRID's for AUTO.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from parallax.cluster import Cluster
from parallax import tf_private
from parallax.partitioner import Partitioned, partitioned_variables, shard_name
from parallax.planning import cost, split_rules
from parallax.planning.analysis import GraphAnalysis
from parallax.planning.measure import Cores, Measurements, measure
from parallax.config import PlanOptions
from parallax.planning.plan import Decision, rule
from parallax.planning.rows import rows_can_be_summed
from parallax.vocabulary import STATEFUL_RANDOM_OP_TYPES, upstream_ops


def decide(graph: tf.Graph, analysis: GraphAnalysis, workers_per_machine: List[int],
           links: Optional[cost.Links] = None, within_machine: Optional[cost.Links] = None,
           cores: Optional[Cores] = None, **options) -> Decision:
    """Measure (measure.measure) and choose (`choose`): the driver's two stages in one call.
    `options`: PlanOptions' (run_option AUTO unless given)."""
    return choose(graph, analysis, measure(graph, analysis, workers_per_machine, links,
                                           within_machine, cores),
                  PlanOptions(**{"run_option": "AUTO", **options}))


def choose(graph: tf.Graph, analysis: GraphAnalysis, measured: Measurements,
           options: PlanOptions) -> Decision:
    """The methods, servers, shards and splits the cost model predicts fastest for what was
    `measured` (links None: assumed), rated with the parameter-server options that will run
    (options.ps_config). options.hierarchical_allreduce None (where the cluster allows
    machine stages) lets the cost model choose. Under another run option than AUTO the methods
    are its rule's, and only the servers, and with options.search_partitions the shards of
    parallax.get_partitioner's variables, are chosen. options.split_variables None lets the
    cost model split the variables the user did not partition, True splits every one a
    server holds that can be, over every machine."""
    run_option, split = options.run_option, options.split_variables
    hierarchical_allreduce = options.hierarchical_allreduce
    priced = cost.ps_options(options.ps_config)
    workers_per_machine, shape = measured.workers_per_machine, measured.shape
    links, within_machine = measured.links or cost.Links(), measured.within_machine
    stats, timed, compute_problem = measured.stats, measured.timing, measured.compute_problem
    if measured.problem:
        return _decision_by_rule(graph, analysis, run_option, split, shape, measured.problem)
    summable = {v.name for v in analysis.sparse if all(
        rows_can_be_summed(graph.get_tensor_by_name(r.values),
                                    graph.get_tensor_by_name(r.indices))
        for r in v.gradients if r.is_sparse)}
    hows = {} if run_option == "AUTO" else {
        name: rule(run_option, info).value for name, info in analysis.variables.items()}
    groups = partitioned_variables(graph) if options.search_partitions else []
    off_servers = _kept_off_servers(analysis) if run_option == "AUTO" else set()
    merged = _merge_shards(stats, groups, summable, hows, off_servers)
    counts = {group.name: range(group.min_partitions,
                                max(group.min_partitions, shape.machines) + 1)
              for group in groups}
    machines = [m for m, count in enumerate(workers_per_machine) for _ in range(count)]
    if not Cluster(machines).machine_groups():
        hierarchical_allreduce = False

    def with_shards(shard_counts):
        return cost.choose_with_allreduce_form(
            list(merged.values()), shape, links, hierarchical_allreduce,
            shard_counts=shard_counts, summable=summable, hows=hows, off_servers=off_servers,
            **priced)

    chosen, staged = with_shards(counts)
    splits, whole = {}, {}
    if split is not False:
        (chosen, staged), splits, whole = _choose_splits(
            graph, analysis, groups, off_servers, shape, split,
            lambda more: with_shards({**counts, **more}), (chosen, staged), merged, links,
            priced)
    partitions = [[call, group.name, len(chosen[group.name].servers) or group.min_partitions]
                  for call, group in enumerate(groups)]
    chosen, stats = _split_shards(chosen, merged, groups + [
        Partitioned(name, [], 1) for name in splits])
    methods = _methods(chosen)
    note = (f"cost model: {shape.machines} machines x {shape.workers_per_machine} workers, "
            f"links {'measured' if measured.links else 'assumed'}: "
            f"{_rate(links.bandwidth)}, {links.latency * 1e6:.3g} us")
    if within_machine:
        note += (f" (within a machine {_rate(within_machine.bandwidth)}, "
                 f"{within_machine.latency * 1e6:.3g} us, not priced)")
    if partitions:
        note += "; partitions: " + ", ".join(f"{name} in {count}"
                                             for _, name, count in partitions)
    note += _splits_note(splits, whole)
    compute = alone = None
    if timed:
        alone = timed.alone
        # Not measured: the workers' machines taken to be like this one, each its own.
        cores = measured.cores or Cores(os.cpu_count() or 1)
        sharing = shape.workers_per_machine * cores.machines_per_kernel
        compute = cost.shared_compute(alone, timed.cpu, sharing, cores.per_machine)
        note += (f"; one worker's step alone {_ms(alone)} "
                 f"({_ms(timed.cpu)} of CPU), {sharing} sharing {cores.per_machine} cores"
                 + (f" ({cores.machines_per_kernel} machines on one kernel)"
                    if cores.machines_per_kernel > 1 else "") + f" {_ms(compute)}")
        off, held = cost.server_updates(chosen, stats, shape)
        if off:
            note += (f", of which the servers' updates take {off:.0%} (the busiest "
                     f"server {max(held):.0%})")
    else:
        note += f"; compute not measured ({compute_problem})"
    def predicted(choice, staged_):
        return cost.step_time(choice, stats, shape, links, compute=compute or 0.0, alone=alone,
                              hierarchical_allreduce=staged_, **priced)

    step = predicted(chosen, staged)
    note += (f"; predicted step {_ms(step)}" if timed
             else f"; predicted communication {_ms(step)} a step")
    alternatives = []
    # Timed on the cluster where the model is unsure: a plan with servers, or one allreducing
    # or allgathering a sparse table, which servers may serve faster where a step is bound by
    # CPU rather than bytes (benchmarks/HISTORY.md: tags). A dense model's allreduce is not.
    unsure = run_option == "AUTO" and (
        any(m.how == cost.PS for m in chosen.values()) or bool(analysis.sparse))
    untried = _why_untried(graph, analysis) if unsure else None
    if untried:
        note += f"; not timed on the cluster: {untried}"
    elif unsure:
        shards = {**{name: range(count, count + 1) for _, name, count in partitions},
                  **{name: range(count, count + 1) for name, count in splits.items()}}
        for label, dense_how, sparse_how in ALTERNATIVES:
            rule_hows = {name: sparse_how if var.sparse else dense_how
                         for name, var in merged.items()}
            if off_servers & {name for name, how in rule_hows.items() if how == cost.PS}:
                continue  # a variable the gradients wait for cannot go to a server
            alternative, alternative_staged = cost.choose_with_allreduce_form(
                list(merged.values()), shape, links, hierarchical_allreduce,
                shard_counts={**counts, **shards}, summable=summable, hows=rule_hows,
                off_servers=off_servers, **priced)
            alternative = _split_shards(alternative, merged, [  # the chosen shards each
                Partitioned(group.name, group.shards, count)
                for group, (_, _, count) in zip(groups, partitions)] + [
                Partitioned(name, [], count) for name, count in splits.items()])[0]
            if alternative != chosen:
                alternatives.append({"name": label, "methods": _methods(alternative),
                                     "machine_stages": alternative_staged,
                                     "step": predicted(alternative, alternative_staged)})
    return Decision(methods, {n: dataclasses.asdict(s) for n, s in stats.items()}, note,
                    compute, alone, dataclasses.asdict(links), step, partitions, staged,
                    [[name, count] for name, count in splits.items()], run_option,
                    alternatives)


# The plans AUTO also times on the cluster (PlanOptions.trial_steps) where the cost model is unsure
# (decide), as (name, how dense variables and how sparse ones are synchronized): the
# run options' rules. PS's wins where a step is bound by CPU rather than bytes (nmt on shared
# cores: benchmarks/HISTORY.md).
ALTERNATIVES = (("AR's rule", cost.ALLREDUCE, cost.ALLGATHER),
                ("HYBRID's rule", cost.ALLREDUCE, cost.PS),
                ("PS's rule", cost.PS, cost.PS))


def _why_untried(graph: tf.Graph, analysis: GraphAnalysis) -> Optional[str]:
    """Why the plans cannot take turns on the training steps, or None: a plan change starts a
    new session, which carries the variables and a tf.data iterator's position over, but
    starts a queue-based input pipeline or a random op of the step over (its numbers drawn
    again from the start). A candidate sampler (sampled softmax, nce_loss) would start over
    too, but it does not count: each worker draws its own candidates, so such a step equals
    one device's in no plan, and the trials lose nothing of it."""
    if graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
        return "its input comes from queue runners, which a new session would start over"
    step = upstream_ops([graph.get_operation_by_name(name)
                         for name in dict.fromkeys(analysis.training_writes)])
    drawn = sorted(op.name for op in step if op.type in STATEFUL_RANDOM_OP_TYPES)
    if drawn:
        return (f"its step draws random numbers ({drawn[0]!r}), which a new session would "
                "draw again from the start")
    return None


def _methods(choice: Dict[str, cost.Method]) -> Dict[str, dict]:
    return {name: {"how": method.how, "server": method.servers[0] if method.servers
                   else None} for name, method in choice.items()}


def _decision_by_rule(graph, analysis, run_option, split, shape, problem) -> Decision:
    """Without measurements (`problem` says why): the run option's rule, HYBRID's for AUTO;
    with `split` True, its server variables split over every machine, in turn, the largest
    first (split_rules.splittable_in_turn)."""
    methods = {name: {"how": rule(run_option, info).value, "server": None}
               for name, info in analysis.variables.items()}
    splits, whole = {}, {}
    if split:
        counts, whole = _splittable_counts(graph, analysis, [], set(), shape)
        on_servers = [name for name in counts if methods[name]["how"] == cost.PS]
        if shape.machines < 2:
            whole.update(dict.fromkeys(on_servers, "the job has one machine"))
        else:
            kept, apart = split_rules.splittable_in_turn(graph, sorted(
                on_servers, key=lambda name: -analysis.variables[name].nbytes))
            splits, whole = dict.fromkeys(kept, shape.machines), {**whole, **apart}
    for name, count in splits.items():
        del methods[name]
        methods.update({shard_name(name, j): {"how": cost.PS, "server": j}
                        for j in range(count)})
    note = f"{_rule_name(run_option)}: {problem}" + _splits_note(splits, whole)
    return Decision(methods, {}, note, splits=[[n, k] for n, k in splits.items()],
                    run_option=run_option)


def _ms(seconds: float) -> str:
    """Milliseconds to two significant digits below 10 (a small model's step is 0.4 ms)."""
    milliseconds = 1000 * seconds
    return f"{milliseconds:.2g} ms" if milliseconds < 10 else f"{milliseconds:.0f} ms"


def _rate(bytes_per_second: float) -> str:
    megabits = bytes_per_second * 8 / 1e6
    return f"{megabits / 1000:.3g} Gbit/s" if megabits >= 1000 else f"{megabits:.3g} Mbit/s"


def _rule_name(run_option: str) -> str:
    return f"{'HYBRID' if run_option == 'AUTO' else run_option}'s rule"


def _kept_off_servers(analysis: GraphAnalysis) -> set:
    """Variables whose updates, or their extra state's (a moving average), the gradients wait
    for: make_plan refuses them on a server, where they would wait for the step's end."""
    writes = {name: set(info.update_ops) for name, info in analysis.variables.items()}
    for state in analysis.extra_state.values():
        if state.owner in writes:
            writes[state.owner].update(state.update_ops)
    return {name for name, ops in writes.items() if ops & analysis.before_gradients}


def _splits_note(splits: Dict[str, int], whole: Dict[str, str]) -> str:
    """The variables split over servers, and why those that cannot be split are kept whole."""
    note = "; split over servers: " + ", ".join(
        f"{name} in {count} shards" for name, count in splits.items()) if splits else ""
    if whole:
        note += "; kept whole: " + ", ".join(f"{name} ({why})" for name, why in whole.items())
    return note


def _pays(split, split_staged, whole, whole_staged, stats, shape, links, priced) -> bool:
    """Whether the plan with split variables is predicted cost.SPLIT_MARGIN faster."""
    seconds = [cost.step_time(choice, stats, shape, links, hierarchical_allreduce=staged,
                              **priced)
               for choice, staged in ((split, split_staged), (whole, whole_staged))]
    return seconds[0] * (1 + cost.SPLIT_MARGIN) < seconds[1]


def _choose_splits(graph, analysis, groups, off_servers, shape, split, choose, whole_plan,
                   merged, links, priced):
    """The plan (methods, machine stages) with the variables the user did not partition split
    where the cost model predicts it pays (with `split` True, every one a server holds, over
    every machine), those splits, and why each other sparse variable is kept whole. Of those
    the plan splits that cannot split together, the largest are kept split in turn
    (split_rules.splittable_in_turn) and the plan is chosen again without the others.
    `choose` plans with extra shard counts; `whole_plan` is the plan without splits."""
    counts, whole = _splittable_counts(graph, analysis, groups, off_servers, shape)
    if split:  # those the plan puts on a server; the others keep the method chosen for them
        elsewhere = {name: whole_plan[0][name].how for name in counts
                     if whole_plan[0][name].how != cost.PS}
        whole.update({name: f"not on a server: {how}" for name, how in elsewhere.items()})
        counts = {name: range(shape.machines, shape.machines + 1) for name in counts
                  if name not in elsewhere}
    splits = {}
    while counts:  # each round keeps whole one more variable at least, or ends
        with_splits = choose(counts)
        splits = {name: len(with_splits[0][name].servers) for name in counts
                  if len(with_splits[0][name].servers) > 1}
        apart = split_rules.splittable_in_turn(
            graph, sorted(splits, key=lambda name: -merged[name].nbytes))[1]
        if not apart:
            break
        whole.update(apart)
        counts = {name: shards for name, shards in counts.items() if name not in apart}
    if splits and (split or _pays(*with_splits, *whole_plan, merged, shape, links, priced)):
        return with_splits, splits, whole
    return whole_plan, {}, whole


def _splittable_counts(graph, analysis, groups, off_servers, shape
                       ) -> Tuple[Dict[str, range], Dict[str, str]]:
    """The shard counts the cost model may give each sparse variable the user did not
    partition (neither with parallax.get_partitioner nor with TensorFlow's partitioners): from
    1 to the number of machines, where the workers can split it (split_rules.splittable)
    and a server may hold it; and why each other one is kept whole."""
    partitioned = {name for group in groups for name in group.shards} | {
        v.op.name for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        if tf_private.save_slice_info(v) is not None}
    counts, whole = {}, {}
    for info in analysis.sparse:
        if info.name in partitioned:
            continue  # the user's own shards
        if info.name in off_servers:
            why = "the gradients wait for its updates, which keeps it off the servers"
        elif info.shape[0] <= 1:
            why = "it has one row"
        else:
            why = split_rules.splittable(graph, [info.name])
        if why is None:
            counts[info.name] = range(1, shape.machines + 1)
        else:
            whole[info.name] = why
    return counts, whole


def _merge_shards(stats, groups, summable, hows, off_servers) -> Dict[str, cost.VariableStats]:
    """The statistics with each partitioned variable whole: the cost model chooses its
    method and number of shards (of the same rows, 1/k to each)."""
    merged = dict(stats)
    for group in groups:
        shards = [merged.pop(name) for name in group.shards]
        first = shards[0]
        merged[group.name] = dataclasses.replace(
            first, name=group.name, nbytes=sum(s.nbytes for s in shards),
            rows=None if not first.sparse else sum(s.rows for s in shards),
            unique=tuple(map(sum, zip(*(s.unique for s in shards)))),
            ready=max(s.ready for s in shards), update=sum(s.update for s in shards))
        if all(name in summable for name in group.shards):
            summable.add(group.name)
        if group.shards[0] in hows:
            hows[group.name] = hows[group.shards[0]]
        if off_servers.intersection(group.shards):
            off_servers.add(group.name)
    return merged


def _split_shards(chosen, merged, groups):
    """Methods and statistics per shard of the partitioned variables (and of those the workers
    will split): k shards, the jth on the jth server chosen; each shard 1/k of the variable."""
    chosen, stats = dict(chosen), dict(merged)
    for group in groups:
        method, whole = chosen.pop(group.name), stats.pop(group.name)
        count = len(method.servers) or group.min_partitions
        for j in range(count):
            name = shard_name(group.name, j)
            chosen[name] = cost.Method(method.how, method.servers[j:j + 1])
            stats[name] = dataclasses.replace(
                whole, name=name, nbytes=whole.nbytes // count,
                rows=None if not whole.sparse else whole.rows // count,
                unique=tuple(u // count for u in whole.unique), update=whole.update / count)
    return chosen, stats
