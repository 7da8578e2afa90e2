"""Collectives: the one seam between Parallax and a collectives library (base.py: what Parallax
asks of one; horovod.py: Horovod's; tensorflow.py: TensorFlow's own collective ops). Nothing
else in the package imports a collectives library."""
from __future__ import annotations

import functools
import importlib.util
from typing import Callable, Optional

from parallax.cluster import Cluster
from parallax.collectives.base import Collectives
from parallax.errors import ConfigError

__all__ = ["Collectives", "choose", "create", "horovod_installed"]


@functools.lru_cache(maxsize=None)
def horovod_installed() -> bool:
    try:
        return importlib.util.find_spec("horovod.tensorflow") is not None
    except ModuleNotFoundError:
        return False


def choose(requested: Optional[str]) -> str:
    """The library a job runs: the one requested (Config.collectives, Cluster.collectives), else
    Horovod where it is installed (its gloo allreduce is the faster on CPU:
    benchmarks/HISTORY.md), else TensorFlow's own collective ops."""
    if requested is None:
        return "horovod" if horovod_installed() else "tensorflow"
    if requested == "horovod" and not horovod_installed():
        raise ConfigError("collectives", "collectives='horovod', and Horovod is not installed "
                          "here (it builds against TensorFlow 2.18 and older): install it, or use "
                          "collectives='tensorflow', TensorFlow's own collective ops")
    return requested


def create(cluster: Cluster, server: Optional[Callable]) -> Collectives:
    """The collectives of a job on `cluster` (cluster.collectives), imported here when a job
    needs them; `server()` is the worker's gRPC server, for those whose sessions run on it
    (None where the collectives only build ops: a rewrite that does not run)."""
    if choose(cluster.collectives) == "tensorflow":
        from parallax.collectives.tensorflow import TensorFlowCollectives  # noqa: C0415

        return TensorFlowCollectives(cluster, server)
    from parallax.collectives.horovod import HorovodCollectives  # pylint: disable=C0415

    return HorovodCollectives(cluster)
