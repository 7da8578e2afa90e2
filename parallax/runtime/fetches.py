"""The structures Session.run takes — lists, tuples, namedtuples and dicts of fetches, nested —
as a flat list and back, keeping dicts' keys as given. tf.nest sorts a dict's keys, which fails
on keys that do not compare: TensorFlow's MonitoredSession fetches {hook: fetches} for its
hooks (runtime/monitored.py)."""
from __future__ import annotations

from typing import Any, Callable, List, Tuple


def flatten(fetches) -> Tuple[List[Any], Callable[[List[Any]], Any]]:
    """The leaves of `fetches` in order, and the function that builds its structure around as
    many values."""
    leaves: List[Any] = []
    build = _flatten(fetches, leaves)
    return leaves, lambda values: build(iter(values))


def _flatten(fetches, leaves: List[Any]) -> Callable:
    if isinstance(fetches, dict):
        parts = [(key, _flatten(value, leaves)) for key, value in fetches.items()]
        kind = type(fetches)
        return lambda values: kind((key, part(values)) for key, part in parts)
    if isinstance(fetches, (list, tuple)):
        parts = [_flatten(value, leaves) for value in fetches]
        if hasattr(fetches, "_fields"):  # a namedtuple
            return lambda values: type(fetches)(*(part(values) for part in parts))
        kind = type(fetches)
        return lambda values: kind(part(values) for part in parts)
    leaves.append(fetches)
    return lambda values: next(values)
