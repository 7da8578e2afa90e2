"""`python -m parallax.verify SCRIPT [ARGS] --resources R --steps N`: Parallax's promise, checked
on the user's own model. The script runs twice, as written: its first N training steps
distributed on R, each worker recording what it read (runtime/recording.py), then on one
device whose steps read the workers' batches of the same step joined, starting from the same
values. Each variable (slots, moving averages and metrics included) of every worker is compared
with one device's, worst first; PASS when every element is within atol + rtol x |one device|.
Where a variable is not, verify measures how far one device is from itself: a second
one-device run with each combined batch's examples in reverse order, the same sums in another
order. A variable whose difference is within ORDER_MARGIN times one device's own is
order-sensitive (its value turns rounding into steps, as Adam does with a gradient that is zero
up to rounding), not trained wrong: it passes, named as such (docs/verify.md).

Exit status: 0 PASS, 1 FAIL, 2 not compared (a run failed, or one device cannot take the
workers' steps: verify says why).

Verify's options may come anywhere; an argument of the script's with the same name goes after
`--`. The distributed run writes its record in --out (a temporary folder by default), which the
workers on other hosts must see at the same path (a shared file system).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from parallax import contracts, script_command
from parallax.runtime import recording

PASSED, FAILED, NOT_COMPARED = 0, 1, 2
ATOL, RTOL = 1e-5, 1e-4
# A variable is within one device's own rounding where its difference is at most this many
# times one device's from itself: the reversed run is one sample of that rounding, and the
# workers' sums, in parts and then across, are ordered otherwise again (docs/verify.md)
ORDER_MARGIN = 4.0


def verify(script: str, arguments: Sequence[str], resources: str, steps: int,
           atol: float = ATOL, rtol: float = RTOL, out: Optional[str] = None) -> int:
    """Runs the comparison and prints its report: the exit status."""
    folder = out or tempfile.mkdtemp(prefix="parallax-verify-")
    try:
        os.makedirs(folder, exist_ok=True)
        return _verify(script, list(arguments), resources, steps, atol, rtol,
                       os.path.abspath(folder))
    finally:
        if out is None:
            shutil.rmtree(folder, ignore_errors=True)


def _verify(script, arguments, resources, steps, atol, rtol, folder) -> int:
    say(f"the distributed run: {script} on {resources}, its first {steps} training steps")
    run = contracts.VerifyRun(folder, steps, contracts.DISTRIBUTED, resources)
    code = _run_script(script, arguments, run)
    workers = recording.worker_folders(folder)
    if code != 0:
        return _not_compared(f"the distributed run failed (exit status {code})")
    done = [len([f for f in os.listdir(w) if f.startswith("step")]) for w in workers]
    if not workers or min(done) < steps:
        return _not_compared(
            f"the script ran {min(done, default=0)} training steps, fewer than --steps {steps}: "
            f"verify with --steps {min(done, default=0)} or fewer" if min(done, default=0)
            else "the script ran no training step (a run that applies its gradients)")
    say(f"the one-device run: {script}, its first {steps} training steps on the "
        f"{len(workers)} workers' batches joined")
    one_device = contracts.VerifyRun(folder, steps, contracts.ONE_DEVICE, workers=len(workers))
    code = _run_script(script, arguments, one_device)
    why = _one_device_problem(folder, code, one_device)
    if why:
        return _not_compared(why)
    notes = os.path.join(folder, recording.NOTES)
    if os.path.exists(notes):
        with open(notes) as f:
            for line in f:
                say(line.rstrip("\n"))
    reference = recording.load(one_device.one_device_file)
    rows = compare(reference, [recording.load(os.path.join(w, "final.npz")) for w in workers],
                   atol, rtol)
    failed = sum(not row.passed for row in rows)
    if failed:
        say(f"{failed} variables are not within the tolerance: "
            "the one-device run again, each combined batch's examples in reverse order, for "
            "how far one device is from itself")
        reordered = dataclasses.replace(one_device, reordered=True)
        code = _run_script(script, arguments, reordered)
        why = _one_device_problem(folder, code, reordered)
        if why:
            say(f"the reordered one-device run: {why}; no variable judged order-sensitive")
        else:
            judge_order(rows, reference, recording.load(reordered.one_device_file))
    print(report(rows, script, resources, len(workers), steps, atol, rtol), flush=True)
    return FAILED if any(not row.passed for row in rows) else PASSED


def _one_device_problem(folder: str, code: int, run: contracts.VerifyRun) -> Optional[str]:
    problem = os.path.join(folder, "problem.txt")
    if os.path.exists(problem):
        with open(problem) as f:
            return f.read()
    if code != 0 or not os.path.exists(run.one_device_file):
        return f"the one-device run failed (exit status {code})"
    return None


class Row:
    """One variable: its largest difference from one device over the workers."""

    def __init__(self, name: str):
        self.name = name
        self.absolute = 0.0  # max |worker - one device|
        self.relative = 0.0  # that over max |one device|
        self.worker = 0  # where the largest difference is
        self.passed = True
        self.note = ""
        self.own = None  # max |one device - one device reordered|, where measured
        self.order_sensitive = False  # passed within one device's own rounding

    def add(self, worker: int, mine: np.ndarray, reference: np.ndarray, atol, rtol) -> None:
        if mine.shape != reference.shape:
            self.passed, self.note = False, f"shape {mine.shape} against {reference.shape}"
            self.absolute, self.worker = float("inf"), worker
            return
        if _textual(reference):
            same = bool(np.all(mine == reference))
            difference = 0.0 if same else float("inf")
        else:
            gap = np.abs(mine.astype(np.float64) - reference.astype(np.float64))
            difference = float(gap.max()) if gap.size else 0.0
            same = bool(np.all(gap <= atol + rtol * np.abs(reference.astype(np.float64))))
        self.passed = self.passed and same
        if difference > self.absolute or worker == 0:
            self.absolute, self.worker = difference, worker
            scale = float(np.abs(reference).max()) if reference.size and np.issubdtype(
                reference.dtype, np.number) else 0.0
            self.relative = difference / scale if scale else (0.0 if not difference
                                                              else float("inf"))


def _textual(value: np.ndarray) -> bool:
    """Strings (tf.string's bytes), compared equal or not, not by a difference."""
    return value.dtype == object or value.dtype.kind in "SU"


def compare(one_device: Dict[str, np.ndarray], workers: List[Dict[str, np.ndarray]],
            atol: float, rtol: float) -> List[Row]:
    """Per variable of one device's, the worst difference of any worker's, worst first."""
    rows = []
    for name in one_device:
        row = Row(name)
        for index, values in enumerate(workers):
            if name not in values:
                row.passed, row.note, row.absolute = False, f"not on worker {index}", np.inf
                continue
            row.add(index, values[name], one_device[name], atol, rtol)
        rows.append(row)
    return sorted(rows, key=lambda r: (r.passed, -r.relative, -r.absolute, r.name))


def judge_order(rows: List[Row], one_device: Dict[str, np.ndarray],
                reordered: Dict[str, np.ndarray]) -> None:
    """Each failed row's own rounding (one device against itself reordered); those within
    ORDER_MARGIN times it pass as order-sensitive."""
    for row in rows:
        if row.passed or row.note or row.name not in reordered:
            continue
        mine, reference = reordered[row.name], one_device[row.name]
        if _textual(reference):
            continue
        gap = np.abs(mine.astype(np.float64) - reference.astype(np.float64))
        row.own = float(gap.max()) if gap.size else 0.0
        if row.own and row.absolute <= ORDER_MARGIN * row.own:
            row.passed = row.order_sensitive = True
    rows.sort(key=lambda r: (r.passed, not r.order_sensitive, -r.relative, -r.absolute, r.name))


def report(rows: List[Row], script, resources, workers, steps, atol, rtol) -> str:
    width = max([len("variable")] + [len(r.name) for r in rows])
    own = any(row.own is not None for row in rows)
    lines = [f"parallax verify: {script}, {steps} training steps on {resources} ({workers} "
             "workers) against one device on the same combined batches",
             f"{'variable':<{width}}  {'max |diff|':>10}  {'relative':>9}  {'worker':>6}  "
             + (f"{'one device':>10}  " if own else "") + "result"]
    for row in rows:
        result = ("FAIL" if not row.passed else "within one device's own rounding "
                  "(order-sensitive)" if row.order_sensitive else "ok")
        lines.append(f"{row.name:<{width}}  {row.absolute:>10.3g}  {row.relative:>9.3g}  "
                     f"{row.worker:>6}  " + (f"{_gap(row.own):>10}  " if own else "")
                     + result + (f" ({row.note})" if row.note else ""))
    failed = [row.name for row in rows if not row.passed]
    sensitive = [row.name for row in rows if row.order_sensitive]
    tolerance = f"within {atol:g} + {rtol:g} x |one device|"
    lines.append(f"FAIL: {len(failed)} of {len(rows)} variables not {tolerance} "
                 f"({_names(failed)})" if failed
                 else f"PASS: all {len(rows)} variables of the {workers} workers {tolerance}"
                 + (f", or within {ORDER_MARGIN:g} x one device's own rounding where the order "
                    f"of its sums moves it ({len(sensitive)} order-sensitive: "
                    f"{_names(sensitive)})" if sensitive else ""))
    lines.append("relative: max |diff| over the variable's largest |value| on one device"
                 + ("; one device: max |diff| of one device from itself, each combined "
                    "batch's examples reversed" if own else ""))
    return "\n".join(lines)


def _gap(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3g}"


def _names(names: List[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _run_script(script: str, arguments: List[str], run: contracts.VerifyRun) -> int:
    env = {**os.environ, **run.to_env()}
    return subprocess.run([sys.executable, script, *arguments], env=env).returncode


def _not_compared(why: str) -> int:
    say(f"NOT COMPARED: {why}")
    return NOT_COMPARED


def say(text: str) -> None:
    print(f"parallax verify: {text}", file=sys.stderr, flush=True)


def parse(argv: Sequence[str]) -> Tuple[argparse.Namespace, str, List[str]]:
    """Verify's options wherever they are; the first other word is the script, the rest (and
    everything after `--`) its arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m parallax.verify",
        usage="python -m parallax.verify SCRIPT [ARGS] --resources R --steps N "
              "[--atol A] [--rtol R] [--out DIR] [-- SCRIPT_ARGS]",
        description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--resources", required=True, help="the distributed run's resources")
    parser.add_argument("--steps", type=script_command.positive, required=True,
                        help="training steps to compare")
    parser.add_argument("--atol", type=float, default=ATOL)
    parser.add_argument("--rtol", type=float, default=RTOL)
    parser.add_argument("--out", help="keep the runs' record in this folder")
    return script_command.parse(parser, argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    options, script, arguments = parse(sys.argv[1:] if argv is None else argv)
    return verify(script, arguments, options.resources, options.steps, options.atol,
                  options.rtol, options.out)


if __name__ == "__main__":
    sys.exit(main())
