"""Shared by the peer benchmarks: free ports, server processes stopped by PID, stamps, percentiles."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from danube.cli.bench import percentiles  # noqa: F401  (one latency summary for danube bench and the peers)
from danube.processes import free_port, server_process, wait_for_port  # noqa: F401  (re-exported for the peers)

STAMP = struct.Struct("<d")  # perf_counter at send, first 8 bytes of every payload

# At a rate every system sends once per PEER_PACE_MS, carrying that interval's messages. Pacing by
# time, not by a message count, is the rule all rows share; it is also what danube.client's defaults
# do (5 ms linger; at 385k msg/s a 1,925-message batch stays under its 256 KiB max_batch_bytes).
PEER_PACE_MS = 5.0


def paced_chunk(rate: float) -> int:
    """Messages per send at ``rate`` messages/s: one PEER_PACE_MS interval's worth."""
    return max(1, round(rate * PEER_PACE_MS / 1000))


def payload(size: int, now: float) -> bytes:
    if size < STAMP.size:
        return b"\x00" * size
    return STAMP.pack(now) + b"\x00" * (size - STAMP.size)


def sent_at(data) -> float | None:
    if len(data) < STAMP.size:
        return None
    return STAMP.unpack_from(data)[0]


@dataclass
class PeerResult:
    system: str
    mode: str  # "max" or "rate=<n>"
    sent: int = 0
    delivered: int = 0
    seconds: float = 0.0
    end_to_end_rate: float = 0.0  # messages delivered / s
    publish_rate: float = 0.0  # messages acked / s
    deliver_latency_ms: dict = field(default_factory=dict)
    ack_latency_ms: dict = field(default_factory=dict)
    note: str = ""
