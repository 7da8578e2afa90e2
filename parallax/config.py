"""User-facing configuration of a Parallax job."""
from __future__ import annotations

import dataclasses
from typing import Optional

# 'MPI' is the paper's name for the AllReduce path; both spell the same mode.
RUN_OPTION_ALIASES = {"AR": "AR", "MPI": "AR"}


@dataclasses.dataclass
class Config:
    """How a job is distributed and run.

    run_option: 'AR' (alias 'MPI'): every worker holds a replica; dense gradients are
        allreduced and sparse ones allgathered with Horovod.
    average_dense / average_sparse: aggregate gradients as the mean over workers (as
        single-device training on the combined batch does for a mean loss) or as the sum.
    sess_config: a tf.compat.v1.ConfigProto for each worker's session (soft placement is
        turned on when not given, so a graph pinned to '/gpu:0' also runs on a CPU worker).
    redirect_path: a folder; when set, each process writes its output to its own log file
        there instead of streaming it to the driver's terminal.
    """

    run_option: str = "AR"
    average_dense: bool = True
    average_sparse: bool = True
    sess_config: Optional[object] = None
    redirect_path: Optional[str] = None

    def __post_init__(self):
        option = str(self.run_option).upper()
        if option not in RUN_OPTION_ALIASES:
            raise ValueError(
                f"unknown run_option {self.run_option!r}: use one of "
                f"{sorted(RUN_OPTION_ALIASES)} ('MPI' is the paper's name for 'AR')")
        self.run_option = RUN_OPTION_ALIASES[option]
