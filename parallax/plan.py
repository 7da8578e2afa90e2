"""Plan: how each variable is synchronized, decided once from the analysis and the config."""
from __future__ import annotations

import dataclasses
import enum
from typing import Dict, List

from parallax.analysis import GraphAnalysis, VariableInfo
from parallax.config import Config


class Sync(enum.Enum):
    ALLREDUCE = "allreduce"  # replicated; dense gradient summed/averaged with Horovod
    ALLGATHER = "allgather"  # replicated; sparse gradient slices gathered from every worker


@dataclasses.dataclass
class VariablePlan:
    variable: VariableInfo
    sync: Sync
    average: bool  # aggregate as the mean over workers, else the sum


@dataclasses.dataclass
class Plan:
    run_option: str
    num_workers: int
    variables: Dict[str, VariablePlan]

    def with_sync(self, *kinds: Sync) -> List[VariablePlan]:
        return [p for p in self.variables.values() if p.sync in kinds]


def make_plan(analysis: GraphAnalysis, config: Config, num_workers: int) -> Plan:
    variables = {}
    for info in analysis.variables.values():
        if info.is_sparse:
            variables[info.name] = VariablePlan(info, Sync.ALLGATHER, config.average_sparse)
        else:
            variables[info.name] = VariablePlan(info, Sync.ALLREDUCE, config.average_dense)
    return Plan(config.run_option, num_workers, variables)


def describe(plan: Plan) -> str:
    """A table of every variable: kind, shape, bytes, where it lives, how it is synchronized."""
    rows = [("variable", "kind", "shape", "bytes", "lives on", "synchronized by")]
    for var_plan in plan.variables.values():
        info = var_plan.variable
        how = f"{var_plan.sync.value} ({'mean' if var_plan.average else 'sum'})"
        rows.append((info.name, "sparse" if info.is_sparse else "dense", str(list(info.shape)),
                     str(info.nbytes), "every worker (replica)", how))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
             for row in rows]
    header = f"Parallax plan: run_option={plan.run_option}, {plan.num_workers} workers"
    return "\n".join([header] + lines)
