"""Benchmark Parallax against Horovod and TensorFlow's parameter servers on an emulated cluster
(network namespaces with rate-limited links, scripts/emulated_cluster.sh; needs root), then
write the report (report.py). Every system trains the same models (workloads.py) in the same
virtualenv, one job after another on the same hosts. With several rates (--rate 100mbit 1gbit
10gbit) every job runs at each rate in turn, each rate's report in OUT/RATE/, and rates.md and
step_time_vs_rate.png in OUT compare them.

    python benchmarks/run.py [--hosts 2] [--workers-per-host 2] [--rate 100mbit [...]]
                             [--workloads cnn cnn-bn lm lm-whole nmt tags] [--systems ...]
                             [--no-ablation]
                             [--no-straggler] [--predict | --only-predict]
                             [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, List, Optional

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, REPO)

from runner.process import JobFailed, ProcessSpec, run_processes  # noqa: E402
from runner.ssh import SSHConfig  # noqa: E402

import report  # noqa: E402

CLUSTER_SCRIPT = os.path.join(REPO, "scripts", "emulated_cluster.sh")
SUBNET = "10.213.0"

# Steps a measured window has at least, per workload: a step of tags takes 15-80 ms, and 10 of
# them, 0.2 s, are moved 20-40% by this machine's noise (run 10 at 1 Gbit: AUTO's windows 30,
# 26 and 22 ms a step).
MIN_WINDOW_STEPS = {"tags": 100}
PS_OFF_ALL = ["local_aggregation", "post_aggregation_placement",
              "boundary_between_workers_and_servers", "defer_gradient_free_server_work"]


@dataclasses.dataclass
class Setup:
    hosts: int
    workers_per_host: int
    state: str  # the emulated cluster's state folder
    measure_args: List[str]
    trial_steps: Optional[int] = None  # AUTO's (Config.trial_steps), where not its default

    def for_workload(self, workload: str) -> "Setup":
        """The setup whose windows have at least MIN_WINDOW_STEPS[workload] steps."""
        args = list(self.measure_args)
        window = args.index("--window") + 1
        args[window] = str(max(int(args[window]), MIN_WINDOW_STEPS.get(workload, 0)))
        return dataclasses.replace(self, measure_args=args)

    def address(self, host: int) -> str:
        return f"{SUBNET}.{host + 2}"

    @property
    def ssh(self) -> SSHConfig:
        return SSHConfig(options=["-F", os.path.join(self.state, "ssh_config")],
                         connect_timeout=5)


def _parallax(run_option, ps_off=(), asynchronous=False, straggler_ms=0, flat_allreduce=False,
              own_batch_norm=False, collectives=None):
    def specs(setup: Setup, workload: str, out: str) -> List[ProcessSpec]:
        resources = _resources(setup)
        argv = [sys.executable, os.path.join(BENCH, "parallax_job.py"), "--workload", workload,
                "--resources", resources, "--run-option", run_option, "--out", out,
                *setup.measure_args]
        if setup.trial_steps is not None:
            argv += ["--trial-steps", str(setup.trial_steps)]
        if ps_off:
            argv += ["--ps-off", *ps_off]
        if asynchronous:
            argv.append("--asynchronous")
        if flat_allreduce:
            argv.append("--flat-allreduce")
        if own_batch_norm:
            argv.append("--own-batch-norm")
        if collectives:
            argv += ["--collectives", collectives]
        if straggler_ms:
            argv += ["--straggler-ms", str(straggler_ms)]
        argv += ["--profile-dir", os.path.join(out, "profile")]  # where its step's time goes
        env = {"PARALLAX_SSH_OPTIONS": f"-F {os.path.join(setup.state, 'ssh_config')}"}
        return [ProcessSpec("parallax", argv, env, cwd=REPO)]
    return specs


def _horovod(sparse_as_dense):
    """horovodrun started inside the first host, as a user logged in there would: a driver
    outside the cluster would hand out an address the hosts cannot use for rendezvous."""
    def specs(setup: Setup, workload: str, out: str) -> List[ProcessSpec]:
        hosts = ",".join(f"h{h + 1}:{setup.workers_per_host}" for h in range(setup.hosts))
        argv = [os.path.join(os.path.dirname(sys.executable), "horovodrun"),
                "-np", str(setup.hosts * setup.workers_per_host), "-H", hosts, "--gloo",
                "--ssh-identity-file", os.path.join(setup.state, "id_ed25519"),
                sys.executable, os.path.join(BENCH, "horovod_job.py"), "--workload", workload,
                "--out", out, *setup.measure_args]
        if sparse_as_dense:
            argv.append("--sparse-as-dense")
        return [ProcessSpec("horovodrun", argv, {}, cwd=REPO, host=setup.address(0),
                            remote=setup.ssh)]
    return specs


def _tf_ps(setup: Setup, workload: str, out: str) -> List[ProcessSpec]:
    """One ps task and G worker tasks a host, each started over ssh."""
    g = setup.workers_per_host
    ps = [f"{setup.address(h)}:2222" for h in range(setup.hosts)]
    workers = [f"{setup.address(h)}:{2223 + i}" for h in range(setup.hosts) for i in range(g)]
    common = [sys.executable, os.path.join(BENCH, "tf_ps_job.py"), "--workload", workload,
              "--ps", ",".join(ps), "--workers", ",".join(workers), "--out", out,
              *setup.measure_args]
    specs = [ProcessSpec(f"ps{h}", common + ["--job", "ps", "--task", str(h)], {}, cwd=REPO,
                         host=setup.address(h), remote=setup.ssh, service=True)
             for h in range(setup.hosts)]
    specs += [ProcessSpec(f"worker{t}", common + ["--job", "worker", "--task", str(t)], {},
                          cwd=REPO, host=setup.address(t // g), remote=setup.ssh)
              for t in range(len(workers))]
    return specs


def predict(setup: Setup, workload: str, out: str, timeout: float) -> None:
    """What `python -m parallax.plan` predicts of each run option on this cluster, probed as a
    job's driver probes it, in out/plan-WORKLOAD.json (prediction_check.py reads it)."""
    resources = _resources(setup)
    argv = [sys.executable, "-m", "parallax.plan", os.path.join(BENCH, "parallax_job.py"),
            "--resources", resources, "--json", "--", "--workload", workload, "--resources",
            resources, "--out", os.path.join(out, "raw", workload, "plan"),
            *setup.measure_args]
    env = dict(os.environ, PARALLAX_SSH_OPTIONS=f"-F {os.path.join(setup.state, 'ssh_config')}")
    print(f"[bench] {workload:4s} plan ...", flush=True)
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        print(f"[bench] {workload:4s} plan: failed: {done.stderr.strip().splitlines()[-1:]}")
        return
    with open(os.path.join(out, f"plan-{workload}.json"), "w") as answer:
        answer.write(done.stdout)


def _resources(setup: Setup) -> str:
    return ";".join(f"{setup.address(h)}:{','.join(map(str, range(setup.workers_per_host)))}"
                    for h in range(setup.hosts))


def _single(setup: Setup, workload: str, out: str) -> List[ProcessSpec]:
    argv = [sys.executable, os.path.join(BENCH, "single_job.py"), "--workload", workload,
            "--out", out, *setup.measure_args]
    return [ProcessSpec("single", argv, {}, cwd=REPO)]


SpecsFn = Callable[[Setup, str, str], List[ProcessSpec]]
SYSTEMS = {  # name -> how to start it
    "parallax-hybrid": _parallax("HYBRID"),
    "parallax-ar": _parallax("AR"),
    "parallax-ps": _parallax("PS"),
    "parallax-auto": _parallax("AUTO"),
    "horovod": _horovod(sparse_as_dense=False),
    "horovod-sparse-as-dense": _horovod(sparse_as_dense=True),
    "tf-ps": _tf_ps,
}
# The collectives library as a dimension of its own (without one, a job runs the stack's
# default: Horovod where it is installed).
COLLECTIVES = {f"{system}@{library}": _parallax(option, collectives=library)
               for system, option in (("parallax-ar", "AR"), ("parallax-hybrid", "HYBRID"))
               for library in ("horovod", "tensorflow")}
# Table 4, cumulative, with one ring for the allreduce; the last stage, parallax-hybrid itself,
# allreduces in machine stages where its cost model predicts them faster (Config's default).
ABLATION = {
    "ablation-ps-base": _parallax("PS", PS_OFF_ALL, flat_allreduce=True),
    "ablation+hybrid": _parallax("HYBRID", PS_OFF_ALL, flat_allreduce=True),
    "ablation+local-aggregation": _parallax("HYBRID", PS_OFF_ALL[1:], flat_allreduce=True),
    "ablation+post-aggregation-placement": _parallax("HYBRID", PS_OFF_ALL[2:],
                                                     flat_allreduce=True),
    "ablation+boundary": _parallax("HYBRID", PS_OFF_ALL[3:], flat_allreduce=True),
    "ablation+deferred-server-work": _parallax("HYBRID", flat_allreduce=True),
}
ABLATION_WORKLOADS = ("lm", "nmt")
STRAGGLER_MS = 300  # the last worker's extra time in each of its steps
STRAGGLER = {  # issue 12: where asynchronous training pays, one worker much slower
    "parallax-ps-straggler": _parallax("PS", straggler_ms=STRAGGLER_MS),
    "parallax-ps-async-straggler": _parallax("PS", asynchronous=True, straggler_ms=STRAGGLER_MS),
}
STRAGGLER_WORKLOADS = ("lm",)
# Issue 36: what combining the workers' batch statistics costs (cnn-bn): without it, each
# worker normalizes its own batch, as Horovod's users do.
BATCH_NORM = {"parallax-ar-own-bn": _parallax("AR", own_batch_norm=True)}
EVERY_JOB = {**SYSTEMS, **COLLECTIVES, **ABLATION, **STRAGGLER, **BATCH_NORM}  # what --systems may name
HOROVOD = importlib.util.find_spec("horovod") is not None  # not on the default stack


def _needs_horovod(system: str) -> bool:
    return system.startswith("horovod") or system.endswith("@horovod")


def run_job(name: str, specs_fn: SpecsFn, setup: Setup, workload: str, out: str,
            timeout: float, folder: str = "") -> dict:
    """The job's result; its records and log are in out/raw/workload/(folder or name)."""
    raw = os.path.join(out, "raw", workload, folder or name)
    shutil.rmtree(raw, ignore_errors=True)
    os.makedirs(raw)
    specs = specs_fn(setup, workload, raw)
    for spec in specs:
        spec.log_file = os.path.join(raw, "log.txt")
    print(f"[bench] {workload:4s} {name} ...", flush=True)
    started = time.monotonic()
    error = None
    try:
        run_processes(specs, timeout=timeout)
    except JobFailed as failure:
        if failure.exit_code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
            raise SystemExit(f"benchmark stopped: {failure}") from failure
        error = str(failure).splitlines()[0]
    finally:
        _stop_leftovers(setup)
    records = [json.load(open(path)) for path in sorted(glob.glob(os.path.join(raw, "*.json")))]
    hosts = 1 if name == "single" else setup.hosts
    if error is None and not (any(r["is_chief"] for r in records)
                              and len({r["host"] for r in records}) == hosts):
        error = f"no record from the chief or from some host ({len(records)} records)"
    print(f"[bench] {workload:4s} {name}: {'failed: ' + error if error else 'done'} "
          f"({time.monotonic() - started:.0f} s; log {raw}/log.txt)", flush=True)
    phases = os.path.join(raw, "profile", "phases.jsonl")
    return {"system": name, "workload": workload, "error": error, "records": records,
            "phases": [json.loads(line) for line in open(phases)]
            if os.path.exists(phases) else []}


def _stop_leftovers(setup: Setup) -> None:
    """Whatever a system left behind on a host (horovodrun's remote commands are not tied to
    its ssh sessions) is killed, so the next job starts on idle hosts; sshd stays."""
    for host in range(1, setup.hosts + 1):
        keep = {int(open(path).read()) for path in glob.glob(
            os.path.join(setup.state, f"sshd-{host}.pid"))}
        pids = subprocess.run(["ip", "netns", "pids", f"pxh{host}"], capture_output=True,
                              text=True).stdout.split()
        for pid in map(int, pids):
            if pid not in keep:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _transform_time() -> dict:
    print("[bench] transforming a ResNet-50 graph ...", flush=True)
    result = subprocess.run([sys.executable, os.path.join(BENCH, "transform_time.py")],
                            capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(result.stdout.strip().splitlines()[-1])


def _kept_results(out: str, rerun: List[str], rate: str, args) -> List[dict]:
    """The results of the workloads not run this time from the folder's previous summary, when
    it was measured on the same cluster: rerunning one workload updates its part of the
    report."""
    path = os.path.join(out, "summary.json")
    if not os.path.exists(path):
        return []
    with open(path) as previous_file:
        previous = json.load(previous_file)
    same = [previous.get(k) for k in ("hosts", "workers_per_host", "rate", "delay")] == [
        args.hosts, args.workers_per_host, rate, args.delay]
    return [r for r in previous["results"] if r["workload"] not in rerun] if same else []


def _tc_rate(text: str) -> str:
    """--rate's type: tc's notation, checked before any cluster comes up."""
    try:
        report.rate_bytes_per_second(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--workers-per-host", type=int, default=2)
    parser.add_argument("--rate", nargs="+", default=["100mbit"], type=_tc_rate,
                        help="each host's link, both ways (tc); several: a run at each")
    parser.add_argument("--delay", help="added latency (needs the kernel's netem qdisc)")
    parser.add_argument("--workloads", nargs="*",
                        default=["cnn", "lm", "lm-whole", "nmt", "tags"],
                        choices=["cnn", "cnn-bn", "lm", "lm-whole", "nmt", "tags"])
    parser.add_argument("--systems", nargs="*",
                        default=[s for s in SYSTEMS if HOROVOD or not _needs_horovod(s)],
                        choices=list(EVERY_JOB),
                        help="also single ablation or straggler stages")
    parser.add_argument("--no-ablation", action="store_true")
    parser.add_argument("--no-straggler", action="store_true",
                        help="leave out the straggler rows (PS, synchronous and not)")
    parser.add_argument("--predict", action="store_true",
                        help="also what python -m parallax.plan predicts of each run option "
                        "(OUT/plan-WORKLOAD.json; prediction_check.py compares)")
    parser.add_argument("--only-predict", action="store_true",
                        help="the predictions alone, into the folders of an earlier run")
    parser.add_argument("--out", default=os.path.join(BENCH, "results"))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per job")
    parser.add_argument("--trial-steps", type=int,
                        help="AUTO's steps timing each plan (Config.trial_steps; default 30)")
    args = parser.parse_args()
    if len(set(args.rate)) < len(args.rate):
        parser.error("--rate: each rate once")
    if not HOROVOD and any(map(_needs_horovod, args.systems)):
        parser.error(f"--systems {[s for s in args.systems if _needs_horovod(s)]}: Horovod is "
                     "not installed here (it is on the Horovod stack: PARALLAX_STACK=horovod "
                     "scripts/bootstrap.sh)")
    if os.geteuid() != 0:
        sys.exit("benchmarks/run.py needs root: the emulated cluster is made of network "
                 "namespaces")
    state = os.environ.get("PARALLAX_BENCH_CLUSTER_DIR", "/tmp/parallax-bench-cluster")
    setup = Setup(args.hosts, args.workers_per_host, state,
                  ["--warmup", str(args.warmup), "--window", str(args.window),
                   "--windows", str(args.windows)], args.trial_steps)
    transform = None
    for rate in args.rate:
        # One rate keeps the folder's layout of before: OUT/summary.json.
        out = args.out if len(args.rate) == 1 else os.path.join(args.out, rate)
        os.makedirs(out, exist_ok=True)
        results = _run_at(rate, args, setup, out)
        if args.only_predict:
            continue
        transform = transform or _transform_time()  # the rate does not change it
        summary = {"transform": transform, "hosts": args.hosts,
                   "workers_per_host": args.workers_per_host, "cores": os.cpu_count(),
                   "rate": rate, "delay": args.delay, "measure": setup.measure_args,
                   "min_window_steps": {w: MIN_WINDOW_STEPS[w] for w in args.workloads
                                        if w in MIN_WINDOW_STEPS},
                   "results": _kept_results(out, args.workloads, rate, args) + results}
        with open(os.path.join(out, "summary.json"), "w") as summary_file:
            json.dump(summary, summary_file, indent=1)
        report.write(summary, out)
        print(f"[bench] report: {os.path.join(out, 'results.md')}")
    if len(args.rate) > 1:  # every OUT/RATE/, those of an earlier run too
        report.write_rates(report.rate_summaries(args.out), args.out)
        print(f"[bench] across rates: {os.path.join(args.out, 'rates.md')}")


def _run_at(rate: str, args, base_setup: Setup, out: str) -> List[dict]:
    """Every selected job of every selected workload on a cluster whose links run at `rate`
    ('up' takes down any cluster before it, unless another live process brought it up),
    taken down after them."""
    shape = ["--rate", rate] + (["--delay", args.delay] if args.delay else [])
    cluster_env = dict(os.environ, PARALLAX_CLUSTER_DIR=base_setup.state)
    results = []
    if subprocess.run(["bash", CLUSTER_SCRIPT, "up", str(args.hosts), *shape],
                      env=cluster_env, stdout=subprocess.DEVNULL).returncode != 0:
        # not taken down: a cluster another process uses is its (emulated_cluster.sh says so)
        sys.exit("benchmarks/run.py: the emulated cluster did not come up (the reason is above)")
    try:
        for workload in args.workloads:
            setup = base_setup.for_workload(workload)
            if args.predict or args.only_predict:
                predict(setup, workload, out, args.timeout)
            if args.only_predict:
                continue
            results.append(run_job("single", _single, setup, workload, out, args.timeout))
            jobs = {name: EVERY_JOB[name] for name in args.systems}
            if not args.no_ablation and workload in ABLATION_WORKLOADS:
                jobs.update(ABLATION)
            if not args.no_straggler and workload in STRAGGLER_WORKLOADS:
                jobs.update(STRAGGLER)
            for name, specs_fn in jobs.items():
                results.append(run_job(name, specs_fn, setup, workload, out, args.timeout))
            # This machine's speed drifts (a virtual machine's cores): one worker alone is
            # measured again after the workload's jobs, and the report takes both.
            results.append(run_job("single", _single, setup, workload, out, args.timeout,
                                   folder="single-after"))
    finally:
        subprocess.run(["bash", CLUSTER_SCRIPT, "down"], env=cluster_env, check=True)
    return results


if __name__ == "__main__":
    main()
