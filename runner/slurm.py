"""Jobs inside a Slurm allocation (salloc, sbatch): the hosts, their tasks and GPUs from Slurm's
environment, and the job's processes started as job steps with `srun` (compute nodes often
refuse ssh). A step runs under runner.remote_exec as over ssh: its environment comes first on
its stdin, and it stops when srun goes away. Slurm ends every step with the allocation, and
`scancel` of the job or of a step stops it.

Slurm's forms:
- SLURM_JOB_NODELIST: `node[01-04,07],login`, ranges within brackets (zero padding kept from
  the lower bound), several bracket groups in a name multiplying out;
- SLURM_TASKS_PER_NODE: `2(x3),1`, a count per node in the nodelist's order;
- SLURM_JOB_GPUS: the allocation's GPU ids (`0,1`), taken to be alike on every node.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import re
import sys
from typing import List, Mapping, Optional

from runner.resources import Host, ResourceError, MAX_SLOTS

SLURM = "slurm"  # the resources that name the allocation
MAX_NODES = 65536
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}$", re.ASCII)
_RANGE = re.compile(r"^([0-9]{1,9})(?:-([0-9]{1,9}))?$", re.ASCII)
_TASKS = re.compile(r"^([0-9]{1,5})(?:\(x([0-9]{1,6})\))?$", re.ASCII)


def names_allocation(resources: str) -> bool:
    """Whether resources are the allocation's ("slurm"), not a resource file of that name."""
    return resources.strip() == SLURM and not os.path.exists(resources)


def in_allocation(env: Mapping[str, str] = os.environ) -> bool:
    return bool(env.get("SLURM_JOB_ID") and env.get("SLURM_JOB_NODELIST"))


def allocation_hosts(env: Mapping[str, str] = os.environ) -> List[Host]:
    """The allocation's hosts, each with a worker slot per task: its GPU ids where the
    allocation has GPUs (as many as its tasks), else 0..tasks-1."""
    if not in_allocation(env):
        raise ResourceError("resources 'slurm' need a Slurm allocation (salloc or sbatch): "
                            "SLURM_JOB_ID and SLURM_JOB_NODELIST are not set")
    nodelist = env["SLURM_JOB_NODELIST"]
    where = f"the Slurm allocation {env['SLURM_JOB_ID']} (SLURM_JOB_NODELIST={nodelist})"
    nodes = expand_nodelist(nodelist)
    tasks = expand_tasks_per_node(env.get("SLURM_TASKS_PER_NODE", ""), len(nodes))
    gpus = _gpu_ids(env.get("SLURM_JOB_GPUS", ""))
    hosts = []
    for node, count in zip(nodes, tasks):
        if gpus and len(gpus) < count:
            raise ResourceError(f"{where}: {count} tasks on {node} but {len(gpus)} GPUs "
                                f"({env['SLURM_JOB_GPUS']}): ask for a task per GPU")
        hosts.append(Host(node, tuple(gpus[:count]) if gpus else tuple(range(count)), where))
    return hosts


def expand_nodelist(text: str) -> List[str]:
    """`node[01-03,07],login` -> node01 node02 node03 node07 login."""
    hosts: List[str] = []
    for item in _split_outside_brackets(text.strip(), text):
        parts = re.split(r"(\[[^\]]*\])", item)
        if any("[" in p or "]" in p for p in parts[::2]):
            raise ResourceError(f"nodelist {text!r}: unbalanced brackets in {item!r}")
        choices = [[p] if i % 2 == 0 else _expand_ranges(p[1:-1], text)
                   for i, p in enumerate(parts)]
        count = 1
        for options in choices:
            count *= len(options)
        if len(hosts) + count > MAX_NODES:
            raise ResourceError(f"nodelist {text!r}: more than {MAX_NODES} nodes")
        for combination in itertools.product(*choices):
            name = "".join(combination)
            if not _NAME.match(name):
                raise ResourceError(f"nodelist {text!r}: {name!r} is not a host name")
            hosts.append(name)
    if len(set(hosts)) != len(hosts):
        raise ResourceError(f"nodelist {text!r} names a node twice")
    return hosts


def expand_tasks_per_node(text: str, nodes: int) -> List[int]:
    """`2(x3),1` -> [2, 2, 2, 1], one count per node ("" or none: one task per node)."""
    if not text.strip():
        return [1] * nodes
    counts: List[int] = []
    for item in text.strip().split(","):
        match = _TASKS.match(item.strip())
        if not match:
            raise ResourceError(f"SLURM_TASKS_PER_NODE {text!r}: {item!r} is not N or N(xM)")
        tasks, repeat = int(match.group(1)), int(match.group(2) or 1)
        if not 1 <= tasks <= MAX_SLOTS or repeat < 1 or len(counts) + repeat > nodes:
            raise ResourceError(f"SLURM_TASKS_PER_NODE {text!r} does not fit {nodes} nodes "
                                f"of 1 to {MAX_SLOTS} tasks")
        counts += [tasks] * repeat
    if len(counts) != nodes:
        raise ResourceError(f"SLURM_TASKS_PER_NODE {text!r} counts {len(counts)} nodes, the "
                            f"nodelist {nodes}")
    return counts


def _split_outside_brackets(text: str, whole: str) -> List[str]:
    items, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
            if depth > 1:
                raise ResourceError(f"nodelist {whole!r}: brackets within brackets")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ResourceError(f"nodelist {whole!r}: ']' without '['")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ResourceError(f"nodelist {whole!r}: '[' without ']'")
    items.append(current)
    if not all(items):
        raise ResourceError(f"nodelist {whole!r}: an empty name")
    return items


def _expand_ranges(text: str, whole: str) -> List[str]:
    numbers = []
    for part in text.split(","):
        match = _RANGE.match(part)
        if not match:
            raise ResourceError(f"nodelist {whole!r}: {part!r} is not N or N-M")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low) or int(high) - int(low) >= MAX_NODES:
            raise ResourceError(f"nodelist {whole!r}: the range {part!r} runs backwards or "
                                f"past {MAX_NODES} nodes")
        numbers += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return numbers


def _gpu_ids(text: str) -> List[int]:
    ids = [word.strip() for word in text.split(",") if word.strip()]
    if not all(word.isdigit() and int(word) < MAX_SLOTS for word in ids):
        return []  # not ids (a GPU type, say): the tasks count the slots
    return [int(word) for word in ids]


@dataclasses.dataclass
class SrunConfig:
    """How the job's processes start on the allocation's nodes: one `srun` job step each,
    sharing the allocation's CPUs (--overlap), every CPU of the node its to use, its GPUs
    asked for where the allocation has them."""

    connect_timeout: int = 60  # seconds a step may take to start (a busy controller)
    forward_env: List[str] = dataclasses.field(default_factory=list)  # srun exports them all
    extra: List[str] = dataclasses.field(default_factory=list)  # more srun options

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "SrunConfig":
        return cls(extra=env.get("PARALLAX_SRUN_OPTIONS", "").split())

    def step_argv(self, host: str) -> List[str]:
        """srun's options for one process on `host`."""
        argv = ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--overlap",
                "--kill-on-bad-exit=1", "--quiet", "--job-name=parallax"]
        cpus = _first_count(os.environ.get("SLURM_JOB_CPUS_PER_NODE", ""))
        if cpus:
            argv.append(f"--cpus-per-task={cpus}")
        gpus = _gpu_ids(os.environ.get("SLURM_JOB_GPUS", ""))
        if gpus:
            argv.append(f"--gres=gpu:{len(gpus)}")
        return argv + self.extra

    def command(self, host: str, remote_argv: List[str], cwd: Optional[str]) -> List[str]:
        """As SSHConfig.command: `remote_argv` on `host` under runner.remote_exec."""
        argv = self.step_argv(host) + ([f"--chdir={cwd}"] if cwd else [])
        return argv + ["--", sys.executable, "-m", "runner.remote_exec"] + list(remote_argv)

    def oneshot(self, host: str, argv: List[str]) -> List[str]:
        """A short command on `host` (free ports, the link probe's client)."""
        return self.step_argv(host) + ["--"] + list(argv)


def _first_count(text: str) -> Optional[int]:
    """SLURM_JOB_CPUS_PER_NODE's first count (`8(x2),4` -> 8)."""
    match = re.match(r"^([0-9]+)", text.strip())
    return int(match.group(1)) if match else None

