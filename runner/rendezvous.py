"""The Horovod gloo rendezvous of a job: Horovod's own RendezvousServer, as horovodrun starts it,
and the environment each rank needs to find it."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from horovod.runner.common.util.hosts import HostInfo, SlotInfo, get_host_assignments
from horovod.runner.gloo_run import create_slot_env_vars
from horovod.runner.http.http_server import RendezvousServer


class GlooRendezvous:
    """Serves the rank layout of `hosts` (name and number of ranks, in rank order); ranks reach
    it at `address`, an address of this machine they can route to."""

    def __init__(self, hosts: Sequence[Tuple[str, int]], address: str, verbose: int = 0):
        self.slots: List[SlotInfo] = get_host_assignments(
            [HostInfo(name, count) for name, count in hosts], sum(c for _, c in hosts))
        self.address = address
        self._server = RendezvousServer(verbose)
        self.port = self._server.start()
        self._server.init(self.slots)

    def env_for_rank(self, rank: int, gloo_iface: Optional[str] = None) -> Dict[str, str]:
        """Without `gloo_iface`, gloo finds the rank's address by resolving its host's name."""
        env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": self.address,
               "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.port),
               "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}
        if gloo_iface:
            env["HOROVOD_GLOO_IFACE"] = gloo_iface
        env.update(create_slot_env_vars(self.slots[rank]))
        return env

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
