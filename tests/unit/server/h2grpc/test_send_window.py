"""Writers waiting for the connection's send window: a connection WINDOW_UPDATE wakes only as many
of them as it serves, in the order they started waiting, and the window one leaves unused goes to
the next, so however the peer splits its window updates, each costs work for the writers it
serves, not for every stream waiting."""

from __future__ import annotations

import asyncio

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from danube.server.h2grpc import frames
from tests.unit.server.h2grpc.test_answers import Peer, loop, message  # noqa: F401 - loop is a fixture

STREAMS = 40
BODY = bytes(100)


def reading_peer(loop, client_settings) -> Peer:  # noqa: F811 - the fixture's name
    """A peer that reads all it is sent at once: writers wait for window, never for the socket."""
    peer = Peer(loop, client_settings=client_settings)
    transport = peer.transport
    transport.write = transport.written.extend  # type: ignore[method-assign]
    peer.frames_since()
    return peer


def blocked_peer(loop) -> Peer:  # noqa: F811 - the fixture's name
    """STREAMS calls answering BODY each, all waiting for the connection's window (used up by a
    first call whose answer is exactly the peer's initial window)."""
    peer = reading_peer(loop, [(frames.INITIAL_WINDOW_SIZE, 1 << 20)])
    big = bytes(frames.DEFAULT_WINDOW - 5)
    peer.send(peer.open(1, "Echo") + frames.frame(frames.DATA, frames.END_STREAM, 1, message(big)))
    assert peer.connection._send_window == 0
    opens = b"".join(
        peer.open(3 + 2 * i, "Echo") + frames.frame(frames.DATA, frames.END_STREAM, 3 + 2 * i, message(BODY))
        for i in range(STREAMS)
    )
    peer.send(opens)
    assert len(peer.connection._window_waiters) == STREAMS
    peer.frames_since()
    return peer


def answered(peer: Peer) -> dict[int, bytes]:
    got: dict[int, bytes] = {}
    for kind, _, stream_id, payload in peer.frames_since():
        if kind == frames.DATA:
            got[stream_id] = got.get(stream_id, b"") + payload
    return got


def test_a_window_update_wakes_only_the_writers_it_serves_in_order(loop):  # noqa: F811
    peer = blocked_peer(loop)
    size = len(message(BODY))
    peer.connection.data_received(frames.window_update(0, 2 * size + 50))
    # woken in the read, before any writer runs: the two it serves whole and the one it serves part of
    assert len(peer.connection._window_waiters) == STREAMS - 3
    peer.send(b"")
    assert answered(peer) == {3: message(BODY), 5: message(BODY), 7: message(BODY)[:50]}
    assert peer.connection._send_window == 0 and peer.connection._window_promised == 0


def test_tiny_window_updates_wake_one_writer_each(loop):  # noqa: F811
    peer = blocked_peer(loop)
    for _ in range(10):
        peer.connection.data_received(frames.window_update(0, 1))
        assert len(peer.connection._window_waiters) == STREAMS - 1  # the first, woken, goes to the back
        peer.send(b"")
    assert answered(peer) == {3 + 2 * i: message(BODY)[:1] for i in range(10)}


def test_window_a_writer_does_not_use_goes_to_the_next_in_line(loop):  # noqa: F811
    peer = blocked_peer(loop)
    connection = peer.connection
    size = len(message(BODY))
    # the first in line is reset by its client before it runs: what it was promised is passed on
    connection.data_received(frames.window_update(0, size))
    connection.data_received(frames.frame(frames.RST_STREAM, 0, 3, (frames.CANCEL).to_bytes(4, "big")))
    peer.send(b"")
    assert answered(peer) == {5: message(BODY)}
    assert connection._window_promised == 0


def test_every_waiting_writer_is_answered_whole_once_the_window_is_back(loop):  # noqa: F811
    peer = blocked_peer(loop)
    peer.send(frames.window_update(0, 1 << 20))
    for _ in range(3):
        peer.send(b"")
    assert answered(peer) == {3 + 2 * i: message(BODY) for i in range(STREAMS)}
    assert peer.statuses.count(("/t.T/Echo", grpc.StatusCode.OK)) == STREAMS + 1
    assert not peer.connection._window_waiters and not peer.connection._stream_waiters
    assert peer.connection._window_promised == 0 and peer.server.open_streams == 0


def test_a_writer_out_of_stream_window_waits_on_its_stream_alone(loop):  # noqa: F811
    peer = reading_peer(loop, [(frames.INITIAL_WINDOW_SIZE, 10)])
    peer.send(
        b"".join(
            peer.open(1 + 2 * i, "Echo") + frames.frame(frames.DATA, frames.END_STREAM, 1 + 2 * i, message(BODY))
            for i in range(3)
        )
    )
    first = answered(peer)
    assert first == {1 + 2 * i: message(BODY)[:10] for i in range(3)}
    assert set(peer.connection._stream_waiters) == {1, 3, 5}
    peer.send(frames.window_update(3, 1000))
    assert answered(peer) == {3: message(BODY)[10:]}
    assert set(peer.connection._stream_waiters) == {1, 5}


window_steps = st.one_of(
    st.tuples(st.just("open"), st.integers(0, 40000)),
    st.tuples(st.just("conn"), st.integers(1, 70000)),
    st.tuples(st.just("stream"), st.integers(0, 9), st.integers(1, 70000)),
    st.tuples(st.just("rst"), st.integers(0, 9)),
    st.tuples(st.just("settings"), st.integers(0, 70000)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 70000), st.lists(window_steps, max_size=25))
def test_no_writer_waits_while_the_window_could_serve_it_and_all_are_answered_in_the_end(initial, script):
    own_loop = asyncio.new_event_loop()
    try:
        peer = reading_peer(own_loop, [(frames.INITIAL_WINDOW_SIZE, initial)])
        connection = peer.connection
        sizes: dict[int, int] = {}
        reset: set[int] = set()
        for step in script:
            if step[0] == "open":
                stream_id = 1 + 2 * len(sizes)
                sizes[stream_id] = step[1]
                body = message(bytes(step[1]))
                peer.send(peer.open(stream_id, "Echo") + frames.frame(frames.DATA, frames.END_STREAM, stream_id, body))
            elif step[0] == "conn":
                peer.send(frames.window_update(0, step[1]))
            elif sizes and step[0] == "stream":
                stream_id = sorted(sizes)[step[1] % len(sizes)]
                peer.send(frames.window_update(stream_id, step[2]))
            elif sizes and step[0] == "rst":
                stream_id = sorted(sizes)[step[1] % len(sizes)]
                reset.add(stream_id)
                peer.send(frames.frame(frames.RST_STREAM, 0, stream_id, (frames.CANCEL).to_bytes(4, "big")))
            elif step[0] == "settings":
                peer.send(frames.settings([(frames.INITIAL_WINDOW_SIZE, step[1])]))
            peer.send(b"")
            assert connection._window_promised == 0  # every writer woken has run
            assert not (connection._window_waiters and connection._send_window > 0), "a writer waits on window left"
        peer.send(frames.window_update(0, 1 << 30) + b"".join(frames.window_update(s, 1 << 30) for s in sizes))
        for _ in range(3):
            peer.send(b"")
        got = answered(peer)
        for stream_id, size in sizes.items():
            if stream_id not in reset:
                assert got.get(stream_id) == message(bytes(size))
        assert not connection._window_waiters and not connection._stream_waiters
        assert not connection.busy
    finally:
        for task in asyncio.all_tasks(own_loop):
            task.cancel()
        own_loop.run_until_complete(asyncio.sleep(0))
        own_loop.close()
