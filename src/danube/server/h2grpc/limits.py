"""Every bound of the client port's HTTP/2 server, with its default, in one place.

``H2Limits`` is what ``H2Server`` takes; the broker loads it once, from the ``http2:`` section
of its config file (keys = the field names below; ``danube.settings.load_section``), and
``--max-connections`` (docs/broker.md, "The gRPC server on the client port").  A limit a peer trips is
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

from danube.settings import ConfigError, check_settings, load_section, setting

MiB = 1024 * 1024
_MAX_WINDOW = 2**31 - 1  # HTTP/2 windows and stream counts are 31-bit


@dataclasses.dataclass(frozen=True)
class H2Limits:
    # ---- what is advertised in SETTINGS, and the windows
    max_receive_message_length: int = setting(64 * MiB, minimum=1)  # larger request messages: RESOURCE_EXHAUSTED
    # SETTINGS_MAX_CONCURRENT_STREAMS; streams past it are refused (RST_STREAM REFUSED_STREAM).
    # Danube's server advertises no limit, and a danube-client carries every call to a broker
    # on one connection, each consumer holding a stream for good: a client past this limit has
    # its further calls held by its transport forever.  Finite all the same, so that one peer
    # cannot take max_streams_total alone; a connection never holds more than that anyway.
    max_concurrent_streams: int = setting(4096, minimum=1, maximum=_MAX_WINDOW)
    # Per-stream and connection receive windows: large enough that a client publishing
    # batches of a few MiB is never waiting on WINDOW_UPDATE round trips.
    stream_window: int = setting(8 * MiB, minimum=1, maximum=_MAX_WINDOW)
    connection_window: int = setting(32 * MiB, minimum=65535, maximum=_MAX_WINDOW)
    # What a connection's window starts at; it doubles (up to connection_window) each time the
    # connection has moved four windows' worth, budget permitting, so idle connections do not
    # hold the request budget as open windows.
    initial_connection_window: int = setting(1 * MiB, minimum=65535, maximum=_MAX_WINDOW)
    max_frame_size: int = setting(
        1 * MiB, minimum=16384, maximum=16777215
    )  # SETTINGS_MAX_FRAME_SIZE; larger: FRAME_SIZE_ERROR
    max_header_list_size: int = setting(64 * 1024, minimum=1)  # SETTINGS_MAX_HEADER_LIST_SIZE (decoded, RFC 7541 sizes)
    # Headers in one request's block (grpc's C core and Envoy allow 100 metadata entries; a
    # danube client sends about 10).  Each costs a few microseconds of HPACK decoding in Python.
    max_header_count: int = setting(128, minimum=1)

    # ---- per connection, against hostile peers
    max_continuation_frames: int = setting(16, minimum=1)  # CONTINUATION frames in one header block
    max_settings_entries: int = setting(32, minimum=1)  # entries in one SETTINGS frame (nghttp2's default)
    # Stream resets (the client's RST_STREAM on a stream it opened under a second before,
    # streams refused, streams reset for the client's errors): a token bucket of reset_burst
    # tokens refilled at resets_per_second (HTTP/2 Rapid Reset, CVE-2023-44487).  A client
    # closing streams it held longer (all its subscriptions at once) is not resetting rapidly.
    reset_burst: int = setting(1000, minimum=1)
    resets_per_second: int = setting(100, minimum=1)
    # Control frames (PING and SETTINGS ACKs, RST_STREAM) queued for a peer that does not read:
    # past the transport's high-water mark, reading pauses and the count is capped.
    max_queued_control_frames: int = setting(1000, minimum=1)
    # ... and a peer that stays that way (replies or responses queued, none read) this long is
    # dropped.
    write_stall_timeout: float = setting(30.0, minimum=0)
    # Frames handled per read before the connection yields to the event loop (reading paused
    # until the next loop iteration), so one peer cannot monopolise the loop.
    max_frames_per_read: int = setting(1024, minimum=1)
    # HEADERS frames (requests: a decode and maybe a handler each) handled per read, as grpc's
    # C core's max_requests_per_read.
    max_requests_per_read: int = setting(32, minimum=1)
    # Header block bytes decoded per read: HPACK decoding costs per header, so a read of many
    # small requests and a read of a few header-stuffed ones cost about the same.
    max_header_bytes_per_read: int = setting(16 * 1024, minimum=1)
    # Request bytes held for unfinished or unread messages; past either budget the server stops
    # returning flow-control window until the handlers catch up.
    max_buffered_bytes: int = setting(128 * MiB, minimum=1)

    # Response bytes waiting for a peer's socket (written to the transport or framed for it):
    # past it, the connection's handlers wait in their writes (a subscription stops being fed,
    # as when credits run out).  A stream queues at most max_send_frame_bytes at a time.
    max_send_queued_bytes: int = setting(4 * MiB, minimum=1)
    max_send_frame_bytes: int = setting(256 * 1024, minimum=1)
    # Connections from one peer address (IP): further ones are refused as over max_connections.
    max_connections_per_peer: int = setting(1024, minimum=1)

    # ---- per server
    max_buffered_bytes_total: int = setting(512 * MiB, minimum=1)
    # Response bytes waiting for peers' sockets over all connections; past it, a connection
    # with a backlog of its own waits for the others to drain.
    max_send_queued_bytes_total: int = setting(256 * MiB, minimum=1)
    max_streams_total: int = setting(16384, minimum=1)  # open streams over all connections; past it: REFUSED_STREAM
    max_connections: int = setting(4096, minimum=1)  # further connections: SETTINGS + GOAWAY, closed at once
    handshake_timeout: float = setting(10.0, minimum=0)  # seconds for the client's preface and SETTINGS; 0 = off
    # Seconds without progress (a call opened or ended, a whole message in or out) before
    # GOAWAY NO_ERROR, whatever streams the connection holds; 0 = off.  A server-streaming call
    # whose handler waits on the broker (a subscription on a quiet topic) keeps it open.
    idle_timeout: float = setting(300.0, minimum=0)

    def __post_init__(self) -> None:
        check_settings(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, **defaults: Any) -> "H2Limits":
        """Limits from the ``http2:`` mapping (field names as keys) over ``defaults``; a
        :class:`~danube.settings.ConfigError` (a ValueError) naming an unknown key or a bad value."""
        if data is not None and not isinstance(data, Mapping):
            raise ConfigError("http2", f"expected a mapping of settings, got {data!r}")
        return load_section(cls, {**defaults, **(data or {})}, "http2")


# The name the first version of the server used.
ServerLimits = H2Limits
