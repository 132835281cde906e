"""What the client's HTTP/2 transport offers its peer and how much it holds for it."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class H2ClientLimits:
    # Receive window of each stream: the most a stream's unread responses can hold (the peer
    # must wait for WINDOW_UPDATE, sent as the call's reader takes messages).
    stream_window: int = 8 * MiB
    # Receive window of the connection, given back as DATA arrives (streams are bounded above).
    connection_window: int = 32 * MiB
    # Largest frame the peer may send (SETTINGS_MAX_FRAME_SIZE); one frame larger ends the connection.
    max_frame_size: int = 256 * 1024
    # Largest response header block (SETTINGS_MAX_HEADER_LIST_SIZE), HEADERS and CONTINUATION together.
    max_header_block: int = 64 * 1024
    # Largest response message, as grpc.aio's max_receive_message_length.
    max_message: int = 64 * MiB
    # Largest request message, as grpc.aio's max_send_message_length.
    max_send_message: int = 64 * MiB
    # Control replies (PING and SETTINGS ACKs) queued while the peer does not read ours.
    max_control_backlog: int = 1000
    # A connection silent this long gets a PING; silent for keepalive_timeout_s after it, it is dead.
    keepalive_s: float = 10.0
    keepalive_timeout_s: float = 5.0
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not 65535 <= self.stream_window <= 2**31 - 1 or not 65535 <= self.connection_window <= 2**31 - 1:
            raise ValueError("HTTP/2 windows must be between 65535 and 2^31-1")
        if not 16384 <= self.max_frame_size <= 2**24 - 1:
            raise ValueError("the HTTP/2 frame size must be between 16384 and 2^24-1")
