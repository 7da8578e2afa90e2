"""The planner's explanation: what a proposal rests on, in words — the cluster and links it
assumed, the measured terms, the shards and splits, the predicted step and, for each rule's
plan, its predicted step and the margin to the proposal's. `runner.describe()` prints it as
the plan's AUTO line; `python -m parallax.plan` prints it for each run option."""
from __future__ import annotations

from parallax.planning import cost
from parallax.planning.candidates import rule_name
from parallax.planning.problem import Problem
from parallax.planning.proposal import SEARCHED, Proposal, terms, unsure


def note(problem: Problem, proposal: Proposal) -> str:
    """How `proposal` was made for `problem`, in one line of '; '-separated parts."""
    if problem.unmeasured:
        return f"{rule_name(problem.run_option)}: {problem.unmeasured}" + _splits(proposal)
    shape, links, inside = problem.shape, problem.links, problem.inside
    text = (f"cost model: {shape.machines} machines x {shape.workers_per_machine} workers, "
            f"links {'measured' if problem.links_measured else 'assumed'}: "
            f"{rate(links.bandwidth)}, {links.latency * 1e6:.3g} us")
    if inside:
        text += (f" (within a machine {rate(inside.bandwidth)}, "
                 f"{inside.latency * 1e6:.3g} us, not priced)")
    if proposal.partitions:
        text += "; partitions: " + ", ".join(f"{name} in {count}"
                                             for _, name, count in proposal.partitions)
    text += _splits(proposal)
    if problem.compute:
        cores = problem.cores
        text += (f"; one worker's step alone {ms(problem.compute.alone)} "
                 f"({ms(problem.compute.cpu)} of CPU), {problem.sharing} sharing "
                 f"{cores.per_machine} cores"
                 + (f" ({cores.machines_per_kernel} machines on one kernel)"
                    if cores.machines_per_kernel > 1 else "")
                 + f" {ms(problem.worker_compute)}")
        off, held = cost.server_updates(proposal.methods, proposal.stats, shape)
        if off:
            text += (f", of which the servers' updates take {off:.0%} (the busiest "
                     f"server {max(held):.0%})")
        rated = terms(problem, proposal.methods, proposal.stats, bool(proposal.machine_stages))
        text += (f"{_transport(problem)}; predicted step {ms(proposal.step)}, the most of it "
                 f"{max(rated, key=rated.get)}")
        if proposal.chosen_rule:
            text += (f"; chosen: {proposal.chosen_rule}, its whole step predicted faster "
                     f"than {SEARCHED} ({_searched_differs(proposal)}), which the search "
                     "rates by its communication")
    else:
        text += (f"; compute not measured ({problem.compute_problem})"
                 f"; predicted communication {ms(proposal.step)} a step")
    if problem.untimed and unsure(problem, proposal):
        text += f"; not timed on the cluster: {problem.untimed}"
    return text + _rules(proposal)


def _rules(proposal: Proposal) -> str:
    """The rules' plans, each predicted step with its margin over the proposal's, and which
    are timed on the cluster."""
    if not proposal.alternatives and not proposal.beyond_error:
        return ""
    text = "; the rules' plans: " + ", ".join(
        f"{a.name} {ms(a.step)} ({margin(proposal, a.step):+.0%}"
        + (", not timed: beyond the model's error)" if a in proposal.beyond_error else ")")
        for a in proposal.alternatives + proposal.beyond_error)
    if not proposal.alternatives:
        text += "; no trials: every other plan is predicted slower by more than the model errs"
    return text


def _searched_differs(proposal: Proposal) -> str:
    """Where the search's plan differs from the rule's plan proposed: the three largest
    variables, each with the search's method."""
    searched = proposal.searched.methods
    differ = [f"{name}: {searched[name]}" for name in sorted(
        searched, key=lambda name: -proposal.stats[name].nbytes)
        if searched[name] != proposal.methods[name]]
    return ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")


def margin(proposal: Proposal, step: float) -> float:
    """How much longer `step` is than the proposal's predicted step, as a fraction of it."""
    return step / proposal.step - 1 if proposal.step else 0.0


def _transport(problem: Problem) -> str:
    """The transport probe's terms, each with its value."""
    probed = problem.transport
    if probed is None:
        return "; transport not probed (its messages' CPU not priced)"
    return (f"; transport probed: a message {ms(probed.message_seconds)}, of CPU "
            f"{ms(probed.worker_cpu_message)} in a worker and {ms(probed.server_cpu_message)} "
            f"in a server, a MB {ms(probed.worker_cpu_byte * 1e6)} and "
            f"{ms(probed.server_cpu_byte * 1e6)}, a pushed row "
            f"{probed.server_cpu_row * 1e6:.2g} us" + _collective(problem.collective))


def _collective(probed) -> str:
    """The collectives probe's terms, each with its value."""
    if probed is None:
        return "; collectives not probed (priced as the transport's messages)"
    return (f"; {library_name(probed.library)} collectives probed: a ring's message "
            f"{ms(probed.message_seconds)}, of CPU "
            f"{ms(probed.cpu_message)}, a MB {ms(probed.cpu_byte * 1e6)}, an allgather "
            f"{ms(probed.cpu_allgather)}")


def _splits(proposal: Proposal) -> str:
    """The variables split over servers, and why those that cannot be split are kept whole."""
    text = "; split over servers: " + ", ".join(
        f"{name} in {count} shards" for name, count in proposal.splits.items()
    ) if proposal.splits else ""
    if proposal.whole:
        text += "; kept whole: " + ", ".join(f"{name} ({why})"
                                             for name, why in proposal.whole.items())
    return text


def library_name(library: str) -> str:
    """A collectives library as people write it ("Horovod's")."""
    return {"horovod": "Horovod's", "tensorflow": "TensorFlow's"}.get(library, library)


def ms(seconds: float) -> str:
    """Milliseconds to two significant digits below 10 (a small model's step is 0.4 ms)."""
    milliseconds = 1000 * seconds
    return f"{milliseconds:.2g} ms" if milliseconds < 10 else f"{milliseconds:.0f} ms"


def rate(bytes_per_second: float) -> str:
    megabits = bytes_per_second * 8 / 1e6
    return f"{megabits / 1000:.3g} Gbit/s" if megabits >= 1000 else f"{megabits:.3g} Mbit/s"
