"""The Horovod gloo rendezvous of a job: Horovod's own RendezvousServer, as horovodrun starts it,
and the environment each rank needs to find it; and a new round of it, for ranks that left
Horovod (hvd.shutdown) to join it again (hvd.init) in the same job."""
from __future__ import annotations

import hmac
import http.client
import os
import secrets
import socket
from typing import Dict, List, Optional, Sequence, Tuple

from horovod.runner.common.util.hosts import HostInfo, SlotInfo, get_host_assignments
from horovod.runner.gloo_run import create_slot_env_vars
from horovod.runner.http.http_server import (RendezvousHandler, RendezvousHTTPServer,
                                             RendezvousServer)
from horovod.runner.util.network import find_port
from horovod.runner.util.threads import in_thread

TOKEN_ENV = "PARALLAX_RENDEZVOUS_TOKEN"  # what a rank shows to start a new round
_NEXT_ROUND = "parallax_next_round"  # a scope no Horovod rank uses


class GlooRendezvous:
    """Serves the rank layout of `hosts` (name and number of ranks, in rank order); ranks reach
    it at `address`, an address of this machine they can route to."""

    def __init__(self, hosts: Sequence[Tuple[str, int]], address: str, verbose: int = 0):
        self.slots: List[SlotInfo] = get_host_assignments(
            [HostInfo(name, count) for name, count in hosts], sum(c for _, c in hosts))
        self.address = address
        self._server = _BoundRendezvousServer(address, verbose)
        self.port = self._server.start(_RoundsHandler)
        self._server.init(self.slots)
        self._token = secrets.token_hex(16)
        self._server.set_round_token(self._token)

    def env_for_rank(self, rank: int, gloo_iface: Optional[str] = None) -> Dict[str, str]:
        """Without `gloo_iface`, gloo finds the rank's address by resolving its host's name."""
        env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": self.address,
               "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.port),
               "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
               TOKEN_ENV: self._token}
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


def next_round() -> None:
    """Forget the last rendezvous, from one rank once every rank is past it and before any joins
    Horovod again. Horovod's server forgets a finished rendezvous only in part: when one scope
    completes it clears every scope's list of finished ranks, so the other scopes' keys stay,
    and it never clears the process sets' scopes. A second hvd.init then read a peer's address
    from the first (gloo: connection refused, send timeouts) within a few joins. Without a
    rendezvous (one process), nothing to forget."""
    if "HOROVOD_GLOO_RENDEZVOUS_ADDR" not in os.environ:
        return
    connection = http.client.HTTPConnection(os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                                            int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
                                            timeout=30)
    try:
        connection.request("DELETE", f"/{_NEXT_ROUND}/{os.environ[TOKEN_ENV]}")
        status = connection.getresponse().status
    finally:
        connection.close()
    if status != 200:
        raise ConnectionError(f"the job's Horovod rendezvous refused a new round (HTTP {status})")


class _RoundsHandler(RendezvousHandler):
    """Horovod's, and DELETE /parallax_next_round/TOKEN: forget every scope's keys."""

    def do_DELETE(self):
        parts = self.path.split("/")
        if len(parts) != 3 or parts[1] != _NEXT_ROUND:
            super().do_DELETE()
            return
        if not hmac.compare_digest(parts[2].encode(), self.server.round_token.encode()):
            self.send_status_code(403)  # a job obeys only its own ranks
            return
        with self.server.finished_list_lock, self.server.cache_lock:  # Horovod's lock order
            self.server.cache.clear()
            self.server.finished_list.clear()
        self.send_status_code(200)


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

    def set_round_token(self, token: str) -> None:
        self._httpd.round_token = token


class _RendezvousHTTPServer6(RendezvousHTTPServer):
    address_family = socket.AF_INET6
