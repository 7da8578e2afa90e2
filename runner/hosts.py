"""The hosts of a job from its resources: a resource file, an inline string, or "slurm" (the
allocation this process runs in). Above both resources.py and slurm.py, which it dispatches to."""
from __future__ import annotations

import os
import re
from typing import List

from runner import slurm
from runner.resources import Host, ResourceError, parse_resources, read_text


def load_resources(spec: str) -> List[Host]:
    """Parse a resource file path or inline resource string into hosts with resolved slots;
    "slurm": the hosts and tasks of the Slurm allocation this process runs in."""
    if not isinstance(spec, str) or not spec.strip():
        raise ResourceError("resources must be a resource file path, a string such as "
                            f"'localhost:0,1', or 'slurm', got {spec!r}")
    if slurm.names_allocation(spec):
        return slurm.allocation_hosts()
    if "\n" not in spec and "\0" not in spec and os.path.isfile(spec):
        return parse_resources(read_text(spec).split("\n"), source=spec)
    if "\n" not in spec and os.sep in spec and not os.path.exists(spec.replace("\0", "")):
        raise ResourceError(f"resource file {spec} does not exist")
    return parse_resources(re.split(r"[;\n]", spec), source="resources string")
