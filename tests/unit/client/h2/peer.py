"""A fake HTTP/2 server peer for the client transport's unit tests: it reads what the client
wrote to a fake transport and writes frames back into the connection."""

from __future__ import annotations

import asyncio

import hpack

from danube.client.h2 import frames
from danube.client.h2.call import H2StreamCall
from danube.client.h2.connection import H2Connection
from danube.client.h2.limits import H2ClientLimits
from danube.proto.danube_batch import batch_pb2 as pb


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.writes = 0
        self.closed = False

    def write(self, data) -> None:
        self.writes += 1
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name, default=None):
        return default


class Peer:
    """The server side: a connection made on a fake transport, the frames the client sent, and
    builders for what the server answers."""

    def __init__(self, limits: H2ClientLimits | None = None) -> None:
        self.limits = limits or H2ClientLimits(keepalive_s=0)
        self.conn = H2Connection("127.0.0.1:1", self.limits)
        self.transport = FakeTransport()
        self.conn.connection_made(self.transport)
        self.encoder = hpack.Encoder()
        self._read = 0
        self.frames: list[tuple[int, int, int, bytes]] = []
        assert bytes(self.transport.written[: len(frames.PREFACE)]) == frames.PREFACE
        self._read = len(frames.PREFACE)

    # the client's side, as the channel a call opens on
    async def connection(self) -> H2Connection:
        return self.conn

    def call(self) -> H2StreamCall:
        return H2StreamCall(self, b"", pb.PublishRequest.SerializeToString, pb.PublishAck.FromString)

    def sent(self) -> list[tuple[int, int, int, bytes]]:
        """Frames the client wrote since the last look."""
        parsed, used = frames.parse_frames(self.transport.written[self._read :], frames.LARGEST_FRAME_SIZE)
        self._read += used
        self.frames += parsed
        return parsed

    def feed(self, data: bytes) -> None:
        self.conn.data_received(data)

    # what a server sends
    def settings(self, pairs=()) -> bytes:
        return frames.settings(list(pairs))

    def headers(self, stream_id: int, pairs, *, end_stream: bool = False) -> bytes:
        block = self.encoder.encode(pairs)
        return frames.frame(
            frames.HEADERS, frames.END_HEADERS | (frames.END_STREAM if end_stream else 0), stream_id, block
        )

    def response_headers(self, stream_id: int) -> bytes:
        return self.headers(stream_id, [(":status", "200"), ("content-type", "application/grpc")])

    def trailers(self, stream_id: int, code: int = 0, message: str | None = None, extra=()) -> bytes:
        pairs = [("grpc-status", str(code))]
        if message is not None:
            pairs.append(("grpc-message", message))
        return self.headers(stream_id, pairs + list(extra), end_stream=True)


def ack(sequence: int) -> bytes:
    return pb.PublishAck(sequence=sequence, first_offset=sequence, last_offset=sequence).SerializeToString()


def messages_bytes(payloads) -> bytes:
    return b"".join(frames.message_prefix(len(p)) + p for p in payloads)


async def turn() -> None:
    """Lets the loop run what was scheduled (flushes, woken tasks)."""
    for _ in range(3):
        await asyncio.sleep(0)
