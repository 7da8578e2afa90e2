"""Resources: which hosts take part in a job and which worker slots each one has.

A resource spec is a file path or an inline string. Either holds one host per line (an inline
string may use ';' between hosts):

    host                 # all GPUs of the host, or one CPU worker where it has none
    host: 0,1            # worker slots 0 and 1 (GPU ids where the host has GPUs)
    host slots=4         # Horovod's hostfile form: slots 0..3
    [fe80::1]: 0,1       # an IPv6 address, in brackets

'#' starts a comment; blank lines are ignored. A host is a name (ASCII letters, digits, '-',
'_' and '.'), an IPv4 address or a bracketed IPv6 address; ids and slot counts are ASCII
digits, at most MAX_SLOTS a host. Anything else is an error naming the source and the line.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import re
import shutil
import subprocess
from typing import List, Optional, Tuple

MAX_SLOTS = 4096  # worker slots (and the largest id + 1) on one host
# Starts with a letter or digit: a name can never be taken for an ssh option.
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}$", re.ASCII)
_IPV6 = re.compile(r"^\[([0-9A-Fa-f:.]{2,45})\]$", re.ASCII)
_NUMBER = re.compile(r"^[0-9]{1,5}$", re.ASCII)
_HOROVOD_SLOTS = re.compile(r"^(\S+)[ \t]+slots[ \t]*=[ \t]*(\S+)$", re.ASCII)
_BRACKETED = re.compile(r"^(\[[^\]]*\])[ \t]*(?::(.*))?$", re.ASCII)


class ResourceError(ValueError):
    """A resource spec that cannot be used; the message names where and why."""


@dataclasses.dataclass(frozen=True)
class Host:
    name: str  # a host name, an IPv4 address or a bracketed IPv6 address
    slots: Tuple[int, ...]  # worker slot ids: GPU ids on a GPU host
    where: str = dataclasses.field(default="", compare=False)  # its source and line, for errors

    @property
    def address(self) -> str:
        """The name as ssh and sockets take it: an IPv6 address without its brackets."""
        return self.name.strip("[]")


def read_text(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read(1 << 20)
        if f.read(1):
            raise ResourceError(f"{path}: larger than 1 MiB, not a resource file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ResourceError(f"{path}, line {line}: not UTF-8 text (byte {error.start})") from None


def parse_resources(lines: List[str], source: str) -> List[Host]:
    hosts: List[Host] = []
    seen = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip(" \t\r")
        if not line:
            continue
        where = f"{source}, line {number}"
        name, slots = _parse_line(line, where)
        if name in seen:
            raise ResourceError(f"{where}: duplicate host {name!r} (first on line {seen[name]})")
        seen[name] = number
        hosts.append(Host(name, slots if slots is not None else _default_slots(name), where))
    if not hosts:
        raise ResourceError(f"{source}: no hosts (the spec is empty or only comments)")
    return hosts


def _parse_line(line: str, where: str) -> Tuple[str, Optional[Tuple[int, ...]]]:
    horovod_form = _HOROVOD_SLOTS.match(line)
    if horovod_form:
        name, count = horovod_form.groups()
        if not _NUMBER.match(count) or not 1 <= int(count) <= MAX_SLOTS:
            raise ResourceError(f"{where}: slots must be a whole number from 1 to {MAX_SLOTS}, "
                                f"got {count!r}")
        return _check_name(name, where), tuple(range(int(count)))
    bracketed = _BRACKETED.match(line)
    if bracketed:
        name, ids_text = bracketed.groups()
        return _check_name(name, where), None if ids_text is None else _parse_ids(ids_text,
                                                                                   where)
    if ":" in line:
        name, _, ids_text = line.partition(":")
        return _check_name(name.strip(" \t"), where), _parse_ids(ids_text, where)
    return _check_name(line, where), None


def _check_name(name: str, where: str) -> str:
    ipv6 = _IPV6.match(name)
    if ipv6:
        try:
            ipaddress.IPv6Address(ipv6.group(1))
            return name
        except ValueError:
            pass
    elif _HOST_NAME.match(name) and ".." not in name:
        if not re.fullmatch(r"[0-9.]+", name):
            return name
        try:  # digits and dots only: an IPv4 address or nothing ('localhost:0;1' is not '1')
            ipaddress.IPv4Address(name)
            return name
        except ValueError:
            pass
    raise ResourceError(f"{where}: {name[:80]!r} is not a host name or address (expected "
                        "'host', 'host: 0,1', 'host slots=N' or '[ipv6]: 0,1'; ';' separates "
                        "hosts)")


def _parse_ids(text: str, where: str) -> Tuple[int, ...]:
    items = [item.strip(" \t") for item in text.split(",")]
    if items == [""]:
        raise ResourceError(f"{where}: no ids after ':' (write 'host' alone for all GPUs)")
    if len(items) > MAX_SLOTS:
        raise ResourceError(f"{where}: {len(items)} ids, more than {MAX_SLOTS} on one host")
    ids, seen = [], set()
    for item in items:
        if not _NUMBER.match(item) or int(item) >= MAX_SLOTS:
            raise ResourceError(f"{where}: bad id {item[:20]!r}: ids are whole numbers from 0 "
                                f"to {MAX_SLOTS - 1} separated by commas ("
                                "';' separates hosts)")
        if int(item) in seen:
            raise ResourceError(f"{where}: id {int(item)} is listed twice")
        seen.add(int(item))
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
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
