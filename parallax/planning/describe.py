"""`runner.describe()`: the plan as a table of every trained variable — kind, shape, bytes, where
it lives, how it is synchronized — and, under AUTO, what the cost model predicted for it; then
every other variable of the graph (slots, global_step, moving averages), and how each follows.
Before the table, each dynamic embedding and how the plan partitions it."""
from __future__ import annotations

import textwrap
from typing import Dict, List, Optional, Sequence

from parallax.contracts import TableRecord
from parallax.planning import cost
from parallax.planning.analysis import GraphAnalysis
from parallax.planning.job_plan import Plan, Sync, cost_shape
from parallax.planning.problem import shards_in


def describe(plan: Plan, analysis: Optional[GraphAnalysis] = None,
             tables: Sequence[TableRecord] = ()) -> str:
    """A table of every trained variable: kind, shape, bytes, where it lives, how it is
    synchronized; under AUTO also alpha (the share of its rows one worker's batch touches), the
    bytes that its busiest link direction carries in a step as predicted (in each of the step's
    phases, cost.link_phases), and the share of the predicted step those bytes take. With the
    `analysis` the plan is bound to, the graph's other variables after it; with the graph's
    dynamic embeddings (contracts.read_tables), a line for each before it."""
    stats = plan.decision.stats if plan.decision is not None else {}
    predicted = _predicted_bytes(plan, stats)
    rows = [("variable", "kind", "shape", "bytes", "lives on", "synchronized by")
            + (("alpha", "predicted bytes", "share of step") if predicted else ())]
    if predicted:
        seconds_per_byte = 1 / (plan.decision.link_model().bandwidth * (plan.decision.step or 1))
    for var_plan in plan.variables.values():
        info = var_plan.variable
        how = f"{var_plan.sync.value} ({'mean' if var_plan.average else 'sum'})"
        if plan.asynchronous and var_plan.sync is Sync.PS:
            how = f"{var_plan.sync.value} (asynchronous)"
        if var_plan.sync is Sync.PS:
            where = f"server {var_plan.server} ({plan.cluster.servers[var_plan.server]})"
        else:
            where = "every worker (replica)"
        row = (info.name, "sparse" if info.is_sparse else "dense", str(list(info.shape)),
               str(info.nbytes), where, how)
        if predicted and info.name not in predicted:  # a graph the driver did not measure
            row += ("-", "-", "-")
        elif predicted:
            measured = stats[info.name]
            alpha = f"{measured.distinct(1) / info.shape[0]:.3f}" if measured.sparse else "-"
            row += (alpha, f"{predicted[info.name]:.0f}",
                    f"{predicted[info.name] * seconds_per_byte:.0%}")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
             for row in rows]
    auto = plan.decision is not None and plan.decision.run_option == "AUTO"
    run_option = f"AUTO ({plan.run_option}'s passes)" if auto else plan.run_option
    if plan.requested_run_option == "HYBRID" and plan.run_option != "HYBRID":
        run_option = ("HYBRID (no sparse variable: every variable allreduced, as AR)"
                      if plan.run_option == "AR" else
                      "HYBRID (no dense variable: every variable on the servers, as PS)")
    header = (f"Parallax plan: run_option={run_option}, {_count(plan.num_workers, 'worker')} on "
              f"{_count(plan.cluster.num_machines, 'machine')}, "
              f"{_count(len(plan.cluster.servers), 'server')}"
              + (", local aggregation"
                 if plan.ps_config.local_aggregation and plan.cluster.servers else "")
              + (", allreduce in machine stages" if plan.hierarchical_allreduce
                 and plan.with_sync(Sync.ALLREDUCE) else ""))
    if plan.asynchronous:
        header += ("\nasynchronous: each worker applies its own gradients to the servers' "
                   "variables as they arrive" + ("; dense variables are allreduced, in step"
                                                 if plan.with_sync(Sync.ALLREDUCE) else ""))
    if plan.decision is not None:
        header += f"\n{'AUTO' if auto else 'servers and shards'}: {plan.decision.note}"
    synchronized = [mean for mean, _ in plan.batch_moments] + plan.fused_batch_norms
    if synchronized:
        header += ("\nbatch norm: statistics of the combined batch, as on one device "
                   f"(sync_batch_norm): {', '.join(synchronized)}")
    elif plan.unsynchronized_batch_norms:
        header += ("\nbatch norm: statistics of each worker's own batch, not one device's "
                   f"(sync_batch_norm=False): {', '.join(plan.unsynchronized_batch_norms)}")
    if plan.summed_writes:
        header += ("\ncounts of the batch, summed over workers as one device counts the "
                   f"combined batch: {', '.join(plan.summed_writes)}")
    if plan.loss_denominators and not plan.asynchronous:
        header += ("\nloss divided by a sum over the batch: by the combined batch's, as on one "
                   f"device: {', '.join(plan.loss_denominators)}")
    other = _other_variables(plan, analysis) if analysis is not None else []
    return "\n".join([header] + _dynamic_embeddings(plan, tables) + _made_dense(plan) + lines
                     + other)


def _dynamic_embeddings(plan: Plan, tables: Sequence[TableRecord]) -> List[str]:
    """A line for each dynamic embedding: what it is, and its parts (the plan splits its
    variable over every machine's server, rewriting/passes/dynamic_tables.py), each holding the
    rows and keys of the ids a hash gives it, and its rows' slots."""
    lines = []
    for table in tables:
        parts = shards_in(table.variable, plan.variables) or [table.variable]
        if parts[0] not in plan.variables:  # not trained: among the other variables
            continue
        rows = sorted({plan.variables[name].variable.shape[0] for name in parts})
        servers = ", ".join(str(plan.variables[name].server) for name in parts)
        where = (f"whole on server {servers}, with its keys" if len(parts) == 1 else
                 f"{len(parts)} parts, one on each server ({servers}), an id's by a hash of "
                 f"it: {' to '.join(map(str, rows))} rows each, with their ids' keys")
        lines.append(f"{table.name}: dynamic embedding (dim {table.dim}, capacity "
                     f"{table.capacity}, {table.key_dtype} ids): {where} and the rows' slots")
    return lines


def _made_dense(plan: Plan) -> List[str]:
    """A line for each variable whose rows are gathered but whose gradient autodiff made dense
    (analysis.VariableInfo.whole_reads): what made it so, and what it costs a step."""
    lines = []
    for var_plan in plan.variables.values():
        info = var_plan.variable
        if not info.whole_reads:
            continue
        terms = " and ".join(f"{op_type!r} (op {name!r})" for op_type, name in info.whole_reads)
        cost_of = (f"pushed whole to server {var_plan.server}, {info.nbytes} bytes from each "
                   "worker a step" if var_plan.sync is Sync.PS
                   else f"allreduced whole, {info.nbytes} bytes a step")
        lines.append(f"{info.name}: dense, its gradient adds a dense term from {terms} to its "
                     f"gathered rows: {cost_of}")
    return lines


def _other_variables(plan: Plan, analysis: GraphAnalysis) -> List[str]:
    """Every variable of the graph without a gradient of its own: the state that lives and is
    updated with its variable (slots, moving averages of it) under that variable, the rest
    grouped by how it is kept."""
    def where(name: str) -> str:
        server = plan.server_of(name)
        return "every worker" if server is None else f"server {server}"

    following: Dict[str, List[str]] = {}
    kept: Dict[str, List[str]] = {}
    for state in analysis.extra_state.values():
        if (state.owner in plan.variables and state.after_gradients and not state.per_worker
                and where(state.name) == where(state.owner)):
            following.setdefault(state.owner, []).append(state.name)
        else:
            kept.setdefault(_how_kept(plan, state, where(state.name)), []).append(state.name)
    untouched = [name for name in analysis.all_variables
                 if name not in plan.variables and name not in analysis.extra_state]
    if untouched:
        kept["every worker, not written by training (worker 0's initial value)"] = untouched
    count = sum(map(len, following.values())) + sum(map(len, kept.values()))
    if not count:
        return []
    lines = [f"other variables, without a gradient of their own: {count}"]
    if following:
        lines.append("  living and updated with their variable (slots, moving averages of it):")
        lines += [_listed(f"    {owner}: ", names) for owner, names in following.items()]
    lines += [_listed(f"  {how}: ", names) for how, names in kept.items()]
    return lines


def _how_kept(plan: Plan, state, where: str) -> str:
    """How extra state that does not simply follow a trained variable is kept."""
    if state.per_worker:
        summed = any(op in plan.summed_writes for op in state.update_ops)
        return (f"every worker, written from each worker's data, each write "
                f"{'summed' if summed else 'averaged'} over workers")
    if where != "every worker":
        return f"{where}, updated there " + ("by each worker's steps" if plan.asynchronous
                                             else "once a step, by the chief")
    if state.after_gradients:
        return "every worker, each replica updating its own copy alike, once a step"
    return "every worker, each its own, written apart from the gradients"


def _listed(prefix: str, names: List[str]) -> str:
    return textwrap.fill(", ".join(names), width=100, initial_indent=prefix,
                         subsequent_indent=" " * len(prefix), break_long_words=False,
                         break_on_hyphens=False)


def _predicted_bytes(plan: Plan, stats: Dict[str, cost.VariableStats]) -> Dict[str, float]:
    """Per variable, the bytes of a step on the link direction it loads most in each phase
    (AUTO plans that measured `stats`)."""
    if not stats:
        return {}
    shape = cost_shape(plan.cluster)
    predicted = {}
    for name, var_plan in plan.variables.items():
        if name not in stats:
            continue
        method = cost.Method(var_plan.sync.value,
                             (var_plan.server,) if var_plan.sync is Sync.PS else ())
        phases = cost.link_phases(stats[name], method, shape,
                                  hierarchical_allreduce=plan.hierarchical_allreduce,
                                  **cost.ps_options(plan.ps_config))
        predicted[name] = cost.busiest_bytes(phases)
    return predicted


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")
