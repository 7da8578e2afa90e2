"""The Horovod gloo rendezvous of a job: Horovod's own RendezvousServer, as horovodrun starts it,
and the environment each rank needs to find it."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import psutil
from horovod.runner.common.util.hosts import HostInfo, SlotInfo, get_host_assignments
from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
from horovod.runner.http.http_server import RendezvousServer


class GlooRendezvous:
    """Serves the rank layout of `hosts` (name and number of ranks, in rank order)."""

    def __init__(self, hosts: Sequence[Tuple[str, int]], address: str, verbose: int = 0):
        self.slots: List[SlotInfo] = get_host_assignments(
            [HostInfo(name, count) for name, count in hosts], sum(c for _, c in hosts))
        self._server = RendezvousServer(verbose)
        self.port = self._server.start()
        self._server.init(self.slots)
        self._run_env = create_run_env_vars(address, [interface_of(address)], self.port)

    def env_for_rank(self, rank: int) -> Dict[str, str]:
        env = {key: str(value) for key, value in self._run_env.items()}
        env.update(create_slot_env_vars(self.slots[rank]))
        return env

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def interface_of(address: str) -> str:
    """The network interface holding `address` (gloo binds to an interface by name)."""
    if address.startswith("127."):
        return "lo"
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    raise ValueError(f"no network interface of this machine has the address {address}")
