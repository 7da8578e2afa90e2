"""The Horovod gloo rendezvous of a job: Horovod's own RendezvousServer, as horovodrun starts it,
and the environment each rank needs to find it."""
from __future__ import annotations

import socket
from typing import Dict, List, Optional, Sequence, Tuple

from horovod.runner.common.util.hosts import HostInfo, SlotInfo, get_host_assignments
from horovod.runner.gloo_run import create_slot_env_vars
from horovod.runner.http.http_server import (RendezvousHandler, RendezvousHTTPServer,
                                             RendezvousServer)
from horovod.runner.util.network import find_port
from horovod.runner.util.threads import in_thread


class GlooRendezvous:
    """Serves the rank layout of `hosts` (name and number of ranks, in rank order); ranks reach
    it at `address`, an address of this machine they can route to."""

    def __init__(self, hosts: Sequence[Tuple[str, int]], address: str, verbose: int = 0):
        self.slots: List[SlotInfo] = get_host_assignments(
            [HostInfo(name, count) for name, count in hosts], sum(c for _, c in hosts))
        self.address = address
        self._server = _BoundRendezvousServer(address, verbose)
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


class _BoundRendezvousServer(RendezvousServer):
    """Horovod's rendezvous server listening on `address` only: its own start() binds every
    interface and takes no address. The same start, with the address (tests/test_control.py
    checks the listening socket, so a Horovod that renames these fails loudly)."""

    def __init__(self, address: str, verbose: int):
        super().__init__(verbose)
        self._address = address

    def start(self, handler_cls=RendezvousHandler):
        server = RendezvousHTTPServer if ":" not in self._address else _RendezvousHTTPServer6
        self._httpd, port = find_port(lambda addr: server(
            (self._address, addr[1]), handler_cls, self._verbose))
        self._listen_thread = in_thread(target=self._httpd.serve_forever)
        return port


class _RendezvousHTTPServer6(RendezvousHTTPServer):
    address_family = socket.AF_INET6
