"""`runner.describe()`: the plan as a table of every variable — kind, shape, bytes, where it
lives, how it is synchronized — and, under AUTO, what the cost model predicted for it."""
from __future__ import annotations

from typing import Dict

from parallax.planning import cost
from parallax.planning.plan import Plan, Sync, cost_shape


def describe(plan: Plan) -> str:
    """A table of every variable: kind, shape, bytes, where it lives, how it is synchronized;
    under AUTO also alpha (the share of its rows one worker's batch touches), the bytes that
    its busiest link direction carries in a step as predicted (in each of the step's phases,
    cost.link_phases), and the share of the predicted step those bytes take."""
    stats = plan.decision.variable_stats() if plan.decision is not None else {}
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
    return "\n".join([header] + lines)


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
