"""Every bound of the client port's HTTP/2 server, with its default, in one place.

``H2Limits`` is what ``H2Server`` takes; the broker builds it from the ``h2:`` section
of its config file (keys = the field names below) and ``--max-connections``
(docs/broker.md, "The gRPC server on the client port").  A limit a peer trips is
logged with the peer and the limit's name, counted in ``H2Server.trips``, and ends
that one connection with GOAWAY (ENHANCE_YOUR_CALM unless a more precise HTTP/2 error
code applies); the other connections are not touched.

Where the defaults come from: grpc's C core and nghttp2 (the latter for the reset
budget, SETTINGS entries, CONTINUATION frames and queued control frames), sized for
this broker's clients (a ``danube-client`` keeps at most a few dozen calls in flight
on one connection).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class H2Limits:
    # ---- what is advertised in SETTINGS, and the windows
    max_receive_message_length: int = 64 * MiB  # larger request messages: RESOURCE_EXHAUSTED
    # SETTINGS_MAX_CONCURRENT_STREAMS; streams past it are refused (RST_STREAM REFUSED_STREAM).
    max_concurrent_streams: int = 256
    # Per-stream and connection receive windows: large enough that a client publishing
    # batches of a few MiB is never waiting on WINDOW_UPDATE round trips.
    stream_window: int = 8 * MiB
    connection_window: int = 32 * MiB
    # What a connection's window starts at; it doubles (up to connection_window) each time the
    # connection has moved four windows' worth, budget permitting, so idle connections do not
    # hold the request budget as open windows.
    initial_connection_window: int = 1 * MiB
    max_frame_size: int = 1 * MiB  # SETTINGS_MAX_FRAME_SIZE; larger: FRAME_SIZE_ERROR
    max_header_list_size: int = 64 * 1024  # SETTINGS_MAX_HEADER_LIST_SIZE (decoded, RFC 7541 sizes)
    # Headers in one request's block (grpc's C core and Envoy allow 100 metadata entries; a
    # danube client sends about 10).  Each costs a few microseconds of HPACK decoding in Python.
    max_header_count: int = 128

    # ---- per connection, against hostile peers
    max_continuation_frames: int = 16  # CONTINUATION frames in one header block
    max_settings_entries: int = 32  # entries in one SETTINGS frame (nghttp2's default)
    # Stream resets (the client's RST_STREAM on an open stream, streams refused, streams reset
    # for the client's errors): a token bucket of reset_burst tokens refilled at resets_per_second
    # (HTTP/2 Rapid Reset, CVE-2023-44487).
    reset_burst: int = 1000
    resets_per_second: int = 100
    # Control frames (PING and SETTINGS ACKs, RST_STREAM) queued for a peer that does not read:
    # past the transport's high-water mark, reading pauses and the count is capped.
    max_queued_control_frames: int = 1000
    # ... and a peer that stays that way (replies or responses queued, none read) this long is
    # dropped.
    write_stall_timeout: float = 30.0
    # Frames handled per read before the connection yields to the event loop (reading paused
    # until the next loop iteration), so one peer cannot monopolise the loop.
    max_frames_per_read: int = 1024
    # HEADERS frames (requests: a decode and maybe a handler each) handled per read, as grpc's
    # C core's max_requests_per_read.
    max_requests_per_read: int = 32
    # Header block bytes decoded per read: HPACK decoding costs per header, so a read of many
    # small requests and a read of a few header-stuffed ones cost about the same.
    max_header_bytes_per_read: int = 16 * 1024
    # Request bytes held for unfinished or unread messages; past either budget the server stops
    # returning flow-control window until the handlers catch up.
    max_buffered_bytes: int = 128 * MiB

    # Response bytes waiting for a peer's socket (written to the transport or framed for it):
    # past it, the connection's handlers wait in their writes (a subscription stops being fed,
    # as when credits run out).  A stream queues at most max_send_frame_bytes at a time.
    max_send_queued_bytes: int = 4 * MiB
    max_send_frame_bytes: int = 256 * 1024
    # Connections from one peer address (IP): further ones are refused as over max_connections.
    max_connections_per_peer: int = 1024

    # ---- per server
    max_buffered_bytes_total: int = 512 * MiB
    # Response bytes waiting for peers' sockets over all connections; past it, a connection
    # with a backlog of its own waits for the others to drain.
    max_send_queued_bytes_total: int = 256 * MiB
    max_streams_total: int = 16384  # open streams over all connections; past it: REFUSED_STREAM
    max_connections: int = 4096  # further connections: SETTINGS + GOAWAY, closed at once
    handshake_timeout: float = 10.0  # seconds for the client's preface and SETTINGS; 0 = off
    # Seconds without progress (a call opened or ended, a whole message in or out) before
    # GOAWAY NO_ERROR, whatever streams the connection holds; 0 = off.  A server-streaming call
    # whose handler waits on the broker (a subscription on a quiet topic) keeps it open.
    idle_timeout: float = 300.0

    _FLOATS = ("handshake_timeout", "idle_timeout", "write_stall_timeout")

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in self._FLOATS:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                    raise ValueError(f"{field.name} must be a number of seconds >= 0 (0 = off), got {value!r}")
            elif not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{field.name} must be a positive integer, got {value!r}")
        if not 16384 <= self.max_frame_size <= 16777215:
            raise ValueError(f"max_frame_size must be within 16384..16777215 (HTTP/2), got {self.max_frame_size}")
        for name in ("stream_window", "connection_window"):
            if getattr(self, name) > 2**31 - 1:
                raise ValueError(f"{name} must be at most 2^31-1 (HTTP/2), got {getattr(self, name)}")
        if self.initial_connection_window < 65535:
            raise ValueError("initial_connection_window must be at least 65535 (the HTTP/2 initial window)")
        if self.connection_window < 65535:
            raise ValueError("connection_window must be at least 65535 (the HTTP/2 initial window)")
        if self.max_concurrent_streams > 2**31 - 1:
            raise ValueError(f"max_concurrent_streams must be at most 2^31-1, got {self.max_concurrent_streams}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, **defaults: Any) -> "H2Limits":
        """Limits from a config mapping (field names as keys) over ``defaults``; ValueError naming
        an unknown key or a bad value."""
        names = {f.name for f in dataclasses.fields(cls)}
        data = dict(data or {})
        unknown = sorted(k for k in data if k not in names)
        if unknown:
            raise ValueError(f"unknown h2 limit(s): {', '.join(map(str, unknown))} (known: {', '.join(sorted(names))})")
        return cls(**{**defaults, **data})


# The name the first version of the server used.
ServerLimits = H2Limits
