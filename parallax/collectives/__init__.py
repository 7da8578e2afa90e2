"""Collectives: the one seam between Parallax and a collectives library (base.py: what Parallax
asks of one; horovod.py: Horovod's). Nothing else in the package imports a collectives
library."""
from __future__ import annotations

from parallax.cluster import Cluster
from parallax.collectives.base import Collectives

__all__ = ["Collectives", "create"]


def create(cluster: Cluster) -> Collectives:
    """The collectives of a job on `cluster`: Horovod's (imported here, when a job needs it)."""
    from parallax.collectives.horovod import HorovodCollectives  # pylint: disable=C0415

    return HorovodCollectives(cluster)
