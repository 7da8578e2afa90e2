"""Authentication of the control plane: a job obeys only its owner.

The driver makes a key for each attempt of the job (`new_key`) and gives it to each process in
its environment (over the ssh channel, never on a command line or the wire). Every beat carries
an HMAC-SHA256 of its body with that key, every answer an HMAC of its own body; the beat's
sequence number, which only grows and which the answer repeats, is the body's
(runner/control_server.py refuses a replay, runner/heartbeat.py an answer to another beat).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Optional

# What a message is for, in its MAC: a beat cannot pass for an answer, nor an answer for a beat.
BEAT = b"beat"
ANSWER = b"answer"
MAC_BYTES = hashlib.sha256().digest_size
UNSIGNED = bytes(MAC_BYTES)  # the MAC of a refusal to a client not of the job


def new_key() -> bytes:
    return secrets.token_bytes(32)


def signed(key: bytes, purpose: bytes, message: dict) -> bytes:
    """`message`'s bytes on the wire: its MAC with `key` for `purpose`, then its JSON."""
    body = json.dumps(message).encode()
    return _mac(key, purpose, body) + body


def encode_beat(key: bytes, beat: dict) -> bytes:
    """A beat's bytes on the wire: its MAC with the job's key, then its JSON."""
    return signed(key, BEAT, beat)


def verified(key: bytes, purpose: bytes, data: bytes) -> Optional[bytes]:
    """The body of `data` if its MAC is right for `purpose`, else None."""
    mac, body = data[:MAC_BYTES], data[MAC_BYTES:]
    return body if hmac.compare_digest(mac, _mac(key, purpose, body)) else None


def _mac(key: bytes, purpose: bytes, body: bytes) -> bytes:
    return hmac.new(key, purpose + b"\0" + body, hashlib.sha256).digest()
