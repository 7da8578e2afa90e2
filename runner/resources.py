"""Resources: which hosts take part in a job and which worker slots each one has.

A resource spec is a file path or an inline string. Either holds one host per line (an inline
string may use ';' between hosts):

    host                 # all GPUs of the host, or one CPU worker where it has none
    host: 0,1            # worker slots 0 and 1 (GPU ids where the host has GPUs)
    host slots=4         # Horovod's hostfile form: slots 0..3

'#' starts a comment; blank lines are ignored.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from typing import List, Optional, Tuple

# Starts with a letter, digit or '[' (IPv6): a name can never be taken for an ssh option.
_HOST_NAME = re.compile(r"^[A-Za-z0-9\[][A-Za-z0-9_.\-\[\]:]*$")
_HOROVOD_SLOTS = re.compile(r"^(\S+)\s+slots\s*=\s*(\S+)$")


class ResourceError(ValueError):
    """A resource spec that cannot be used; the message names where and why."""


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: Tuple[int, ...]  # worker slot ids: GPU ids on a GPU host


def load_resources(spec: str) -> List[Host]:
    """Parse a resource file path or inline resource string into hosts with resolved slots."""
    if not isinstance(spec, str) or not spec.strip():
        raise ResourceError("resources must be a resource file path or a string such as "
                            f"'localhost:0,1', got {spec!r}")
    if os.path.isfile(spec):
        with open(spec, encoding="utf-8") as f:
            return parse_resources(f.read().splitlines(), source=spec)
    if "\n" not in spec and os.sep in spec and not os.path.exists(spec):
        raise ResourceError(f"resource file {spec} does not exist")
    return parse_resources(re.split(r"[;\n]", spec), source="resources string")


def parse_resources(lines: List[str], source: str) -> List[Host]:
    hosts: List[Host] = []
    seen = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}, line {number}"
        name, slots = _parse_line(line, where)
        if name in seen:
            raise ResourceError(f"{where}: duplicate host {name!r} (first on line {seen[name]})")
        seen[name] = number
        hosts.append(Host(name, slots if slots is not None else _default_slots(name)))
    if not hosts:
        raise ResourceError(f"{source}: no hosts (the spec is empty or only comments)")
    return hosts


def _parse_line(line: str, where: str) -> Tuple[str, Optional[Tuple[int, ...]]]:
    horovod_form = _HOROVOD_SLOTS.match(line)
    if horovod_form:
        name, count = horovod_form.groups()
        if not count.isdigit() or int(count) < 1:
            raise ResourceError(f"{where}: slots must be a positive whole number, got {count!r}")
        return _check_name(name, where), tuple(range(int(count)))
    if ":" in line and not line.startswith("["):
        name, _, ids_text = line.partition(":")
        return _check_name(name.strip(), where), _parse_ids(ids_text, where)
    return _check_name(line, where), None


def _check_name(name: str, where: str) -> str:
    if not name or not _HOST_NAME.match(name):
        raise ResourceError(f"{where}: {name!r} is not a host name or address "
                            "(expected 'host', 'host: 0,1' or 'host slots=N')")
    return name


def _parse_ids(text: str, where: str) -> Tuple[int, ...]:
    items = [item.strip() for item in text.split(",")]
    if items == [""]:
        raise ResourceError(f"{where}: no ids after ':' (write 'host' alone for all GPUs)")
    ids = []
    for item in items:
        if not item.isdigit():
            raise ResourceError(f"{where}: bad id {item!r}: ids are whole numbers >= 0 "
                                "separated by commas")
        if int(item) in ids:
            raise ResourceError(f"{where}: id {item} is listed twice")
        ids.append(int(item))
    return tuple(ids)


def _default_slots(host: str) -> Tuple[int, ...]:
    """All GPUs of a local host, else one CPU worker (a remote host counts as one worker)."""
    count = local_gpu_count() if is_local(host) else 0
    return tuple(range(count)) if count else (0,)


def local_gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return sum(1 for line in result.stdout.splitlines() if line.startswith("GPU "))


def is_local(host: str) -> bool:
    """Loopback names are this machine; every distinct loopback address is its own 'machine'
    for placement, but is launched without ssh."""
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")
