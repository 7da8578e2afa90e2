"""Reading a traced run (a RunMetadata's step stats): when ops ran, and each variable's share
of one worker's step, for the driver's measurement (planning/measure.py) and the runtime's
profiler (runtime/profile.py)."""
from __future__ import annotations

import re
from typing import Dict, List, Set, Tuple

from parallax.planning.analysis import GradientSources
from parallax.tf_logs import stderr_lines_dropped

# What TensorFlow's C++ profiler logs for each traced run (and, without a GPU, a warning that
# it collected no GPU trace); its log level is read once, when TensorFlow is loaded.
_PROFILER_LOG = re.compile(rb"profiler_session\.cc:\d+\] Profiler session |"
                           rb"xplane_to_step_stats\.cc:\d+\] GPU trace was not collected")

def profiler_log_dropped():
    """Standard error without the profiler's log lines of a run Parallax traces for itself (the
    driver's probe under AUTO), which a user did not ask for and may read as a problem."""
    return stderr_lines_dropped(_PROFILER_LOG)


def op_spans(step_stats) -> Dict[str, Tuple[int, int]]:
    """{op name: (start, end)} in microseconds of a traced run, on every device."""
    spans: Dict[str, Tuple[int, int]] = {}
    for device in step_stats.dev_stats:
        for node in device.node_stats:
            start = node.all_start_micros
            first, last = spans.get(node.node_name, (start, start))
            spans[node.node_name] = (min(first, start),
                                     max(last, start + node.all_end_rel_micros))
    return spans


def step_shares(step_stats, sources: GradientSources, updates: Dict[str, Set[str]]
                ) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Of one worker's traced step, per variable: the share of the step done when its
    gradient is ready, the end of the last of its gradients' `sources` that ran (1.0 if none
    ran; cost.VariableStats.ready); and its share of the step's updates, `updates` its
    update's ops (cost.VariableStats.update). Updates run side by side: the time some update
    ran is shared among the variables in proportion to the time each one's own ran."""
    spans = op_spans(step_stats)
    begin = min(start for start, _ in spans.values())
    length = max(max(end for _, end in spans.values()) - begin, 1)
    ready = {variable: 1.0 if end is None else (end - begin) / length for variable, end in
             sources.latest({name: end for name, (_, end) in spans.items()}).items()}
    own = {variable: covered([spans[name] for name in names if name in spans])
           for variable, names in updates.items()}
    union = covered([spans[name] for names in updates.values() for name in names
                     if name in spans])
    update = {variable: seconds / max(sum(own.values()), 1) * union / length
              for variable, seconds in own.items()}
    return ready, update


def covered(intervals: List[Tuple[int, int]]) -> int:
    """Microseconds covered by the union of the intervals."""
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total
