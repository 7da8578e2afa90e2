"""The control plane's transport: one gRPC method, `Beat`, whose request and answer are bytes (a
MAC, then JSON: runner/beat_signing.py), on gRPC's generic handlers — no generated code, nothing
of TensorFlow. The only module of the control plane that imports grpc, so the process's grpc
settings below come before it.

The driver's server is grpc's asyncio server: a client that opens calls and never sends their
message holds coroutines, not the few threads a synchronous server has, and cannot delay the
real beats.
"""
from __future__ import annotations

import os
from typing import Callable, Optional, Tuple

# grpc's C core logs a line when the driver's server goes away; that is expected here.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
# With fork support on, every fork (subprocess with preexec_fn, here and in TensorFlow) stops
# and restarts grpc's pollers, which races with them: 'epoll_wait error: Bad file descriptor',
# then SIGABRT, in about one process in five. Our children exec at once and never use grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402

_BEAT_METHOD = "/parallax.Control/Beat"
MAX_MESSAGE_BYTES = 64 * 1024  # a beat is a few hundred bytes; marks and scalars add little
_SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_concurrent_streams", 16),  # per connection
    # A connection, with the calls it holds open, ends after a minute (a real process's
    # channel reconnects at once); a call gets 5 s more to finish.
    ("grpc.max_connection_age_ms", 60_000),
    ("grpc.max_connection_age_grace_ms", 5_000),
    ("grpc.so_reuseport", 0),  # no other process may bind the port beside this one
]
_CLIENT_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]


async def serve(host: str, answer: Callable[[bytes, str], bytes]
                ) -> Tuple[grpc.aio.Server, int]:
    """Starts the Beat service on `host` (as host:port takes it: an IPv6 address bracketed),
    on a port the system picks, and only there; `answer(request, peer)` answers each call.
    The server (stop it in its event loop) and its port."""
    server = grpc.aio.server(options=_SERVER_OPTIONS)

    async def beat(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return answer(request, context.peer())

    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "parallax.Control", {"Beat": grpc.unary_unary_rpc_method_handler(beat)}),))
    port = server.add_insecure_port(f"{host}:0")
    await server.start()
    return server, port


class BeatChannel:
    """A process's channel to the driver's Beat service."""

    def __init__(self, address: str):
        self._channel = grpc.insecure_channel(address, options=_CLIENT_OPTIONS)
        self._call = self._channel.unary_unary(_BEAT_METHOD)

    def call(self, request: bytes, timeout: float) -> Optional[bytes]:
        """The answer to `request`, or None when none came within `timeout` (the driver is
        gone, slow, or out of reach)."""
        try:
            return self._call(request, timeout=timeout)
        except grpc.RpcError:
            return None
