"""Bytes a step should move over each host's link: the paper's Table 3 formulas, counted per
host link for H hosts of G workers (N = H*G) and the actual placement of each variable.

Per variable (w: its bytes; a sparse one moves p = rows * row_bytes of values each way and
q = rows * (row_bytes + index_bytes) with its indices, per worker and step; a lookup gathers one
row per id, repeated ids too, unless the system asks a server for unique rows, as Parallax's
boundary placement does, when p counts unique rows, the paper's alpha * w):
    allreduce (ring over N workers, a host's workers adjacent): each host link carries
        2w(N-1)/N each way (reduce-scatter, then allgather);
    allgather (ring, sparse gradients the AllReduce way): every worker's q reaches every
        other worker: (N-1)q each way;
    parameter server on host s: each worker pulls p and pushes q; host s sends (N-G)p and
        receives (N-G)q, every other host receives Gp and sends Gq. A dense variable is the
        case p = q = w. With Parallax's local aggregation, a machine sends one message of its
        workers' rows summed by id, q_G (the distinct ids of G batches): host s receives
        (H-1)q_G, every other host sends q_G.
Summed over one host link, these equal the per-GPU figures of Table 3 (2w, 4w(N-1)/N, 2aw,
2aw(N-1)) when G = 1. Two facts of the wire that Table 3 leaves out are added: a variable on a
server that a while loop reads is pulled at every iteration (T times), unless the system copies
it to the worker once a step, as Parallax does; and TCP/IP over Ethernet frames each 1448-byte
segment with 66 bytes of headers and acknowledges every second segment with a 66-byte packet
the other way.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

ALLREDUCE, ALLGATHER, PS = "allreduce", "allgather", "ps"
SEGMENT, HEADERS = 1448, 66


def host_bytes(variables: List[dict], sync: Dict[str, Tuple[str, Optional[int]]], hosts: int,
               workers_per_host: int, unique_pulls: bool = False,
               summed_pushes: bool = False, loop_copies: bool = False) -> List[Dict[str, float]]:
    """[{tx, rx}] per host. `variables`: {name, bytes, rows, unique_rows, row_bytes,
    index_bytes} (rows is None for a dense variable; unique_rows[k-1]: distinct ids in k
    workers' batches); `sync`: name -> (how, server host for PS)."""
    n, g = hosts * workers_per_host, workers_per_host
    links = [{"tx": 0.0, "rx": 0.0} for _ in range(hosts)]
    for variable in variables:
        how, server = sync[variable["name"]]
        sparse = variable["rows"] is not None and how != ALLREDUCE
        if not sparse:
            pull = push = variable["bytes"]
            if how == PS and not loop_copies:
                pull *= variable["reads"]
        else:
            pulled_rows = variable["unique_rows"][0] if unique_pulls else variable["rows"]
            pull = pulled_rows * variable["row_bytes"]
            push = variable["rows"] * (variable["row_bytes"] + variable["index_bytes"])
        summed = sparse and summed_pushes and how == PS
        if summed:
            push = variable["unique_rows"][g - 1] * (variable["row_bytes"]
                                                     + variable["index_bytes"])
        for host, link in enumerate(links):
            if how == ALLREDUCE:
                sent = received = 2 * pull * (n - 1) / n if hosts > 1 else 0.0
            elif how == ALLGATHER:
                sent = received = (n - 1) * push if hosts > 1 else 0.0
            elif host == server:
                sent, received = (n - g) * pull, (hosts - 1 if summed else n - g) * push
            else:
                sent, received = (1 if summed else g) * push, g * pull
            link["tx"] += sent
            link["rx"] += received
    return links


def on_the_wire(payload: Dict[str, float]) -> Dict[str, float]:
    """A link's payload bytes (tx, rx) as the interface counts them, framing included."""
    def framed(own, other):
        return own * (1 + HEADERS / SEGMENT) + other / SEGMENT / 2 * HEADERS
    return {"tx": framed(payload["tx"], payload["rx"]), "rx": framed(payload["rx"], payload["tx"])}
