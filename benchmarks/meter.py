"""What every benchmark worker records, whichever system runs it: the wall time of windows of
training steps after a warm-up, and its host's network counters and the machine's CPU time
around them. The counters are the interfaces of the worker's network namespace (its host's
link on the emulated cluster), so any one worker of a host reports that host's traffic; the CPU
time is the kernel's, which every emulated host shares: whether a step is bound by the cores
rather than the link."""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Callable, Dict, Optional

SYS_NET = "/sys/class/net"
PROC_STAT = "/proc/stat"


def interface_counters() -> Dict[str, Dict[str, int]]:
    counters = {}
    for interface in sorted(os.listdir(SYS_NET)):
        if interface == "lo":
            continue
        stats = os.path.join(SYS_NET, interface, "statistics")
        counters[interface] = {name: int(open(os.path.join(stats, name)).read())
                               for name in ("tx_bytes", "rx_bytes")}
    return counters


def machine_cpu() -> Dict[str, float]:
    """Seconds of CPU time of all of this kernel's cores since boot: busy (processes, the
    kernel, interrupts: the network's work too), idle (waiting included), and stolen by the
    hypervisor for other machines."""
    with open(PROC_STAT) as stat:
        ticks = [int(t) for t in stat.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    hertz = os.sysconf("SC_CLK_TCK")
    return {"busy": (user + nice + system + irq + softirq) / hertz,
            "idle": (idle + iowait) / hertz, "steal": steal / hertz}


def measure(run_step: Callable[[], None], out_dir: str, is_chief: bool, warmup: int,
            window: int, windows: int, **details) -> None:
    """Run warm-up steps, then `windows` windows of `window` steps; this worker's record
    (seconds and the process's CPU seconds per window, counters and the machine's CPU time
    before and after them) is written to `out_dir` after each window, so a worker stopped at
    the end of a job (TF-PS workers one step behind a chief that has finished, say) still
    reports the windows it completed."""
    for _ in range(warmup):
        run_step()
    record = dict(details, host=socket.gethostname(), pid=os.getpid(), is_chief=is_chief,
                  window_steps=window, window_seconds=[], window_cpu_seconds=[],
                  counters_before=interface_counters(), machine_cpu_before=machine_cpu())
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{record['host']}-{record['pid']}.json")
    for _ in range(windows):
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(window):
            run_step()
        record["window_seconds"].append(time.perf_counter() - start)
        record["window_cpu_seconds"].append(time.process_time() - cpu_start)
        record["counters_after"] = interface_counters()
        record["machine_cpu_after"] = machine_cpu()
        with open(path + ".tmp", "w") as out:
            json.dump(record, out)
        os.replace(path + ".tmp", path)


def placement(graph) -> Dict[str, Optional[int]]:
    """Trainable variable -> the ps task holding it, or None for a replica on the worker."""
    where = {}
    for variable in graph.get_collection("trainable_variables"):
        device = variable.op.device
        where[variable.op.name] = (int(device.split("/job:ps/task:")[1].split("/")[0])
                                   if "/job:ps/task:" in device else None)
    return where


def machine_stages(graph) -> bool:
    """Whether the job allreduces in machine stages: Horovod allreduces of process sets."""
    return any(op.type == "HorovodAllreduce" and op.get_attr("process_set_id")
               for op in graph.get_operations())


def add_arguments(parser) -> None:
    """The options every system's benchmark script takes."""
    parser.add_argument("--workload", required=True,
                        choices=["cnn", "cnn-bn", "lm", "lm-whole", "nmt", "tags"])
    parser.add_argument("--out", required=True, help="folder for the workers' records")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--window", type=int, default=10, help="steps per measured window")
    parser.add_argument("--windows", type=int, default=3)
