"""danube.client follows ``x-danube-broker-url``: after a refusal that names the owner, the next attempt
of the same retry loop connects to that owner without a lookup."""

from __future__ import annotations

import grpc

from danube.client.connection import Connections, RetryPolicy, RetryState, broker_url_of, retrying


def _refusal(url: str | None) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata(("x-danube-broker-url", url)) if url else grpc.aio.Metadata()
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        trailing,
        details="topic /default/t is served by another broker",
    )


def test_broker_url_of_reads_the_trailing_metadata():
    assert broker_url_of(_refusal("http://127.0.0.1:7001")) == "http://127.0.0.1:7001"
    assert broker_url_of(_refusal(None)) is None


async def test_the_retry_after_a_refusal_goes_to_the_named_owner():
    conns = Connections("http://127.0.0.1:7000")
    seen = []

    async def attempt():
        conn = await conns.lookup("/default/t")
        seen.append(conn.address)
        if len(seen) == 1:
            raise _refusal("http://127.0.0.1:7001")
        return conn.address

    # the first lookup cannot reach a broker: the first attempt is served a connection by a stub
    async def first_lookup(topic, _orig=conns.lookup):
        if not seen:
            return conns.connection()
        return await _orig(topic)

    conns.lookup = first_lookup  # type: ignore[method-assign]
    policy = RetryPolicy(initial_backoff_s=0.0, max_backoff_s=0.0, give_up_after_s=5)
    assert await retrying(attempt, RetryState(policy), what="test") == "127.0.0.1:7001"
    assert seen == ["127.0.0.1:7000", "127.0.0.1:7001"]
    await conns.close()


async def test_without_the_header_the_retry_looks_up_again():
    conns = Connections("http://127.0.0.1:7000")
    calls = []

    async def attempt():
        calls.append(1)
        if len(calls) == 1:
            raise _refusal(None)
        from danube.client import connection

        return connection._redirect_hint.get()

    policy = RetryPolicy(initial_backoff_s=0.0, max_backoff_s=0.0, give_up_after_s=5)
    assert await retrying(attempt, RetryState(policy), what="test") is None
    await conns.close()
