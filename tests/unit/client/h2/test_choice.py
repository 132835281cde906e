"""Which transport carries the client's streams: the builder option, the environment, TLS."""

from __future__ import annotations

import pytest

from danube.client import DanubeClient
from danube.client.connection import BrokerConnection
from danube.client.h2.lane import GrpcBatchLane, H2BatchLane
from danube.client.security import with_token
from danube.errors import InvalidArgumentError


async def test_h2_is_the_default_and_the_environment_or_the_builder_can_choose_grpc(monkeypatch):
    monkeypatch.delenv("DANUBE_CLIENT_TRANSPORT", raising=False)
    conn = BrokerConnection("127.0.0.1:1")  # nothing connects until a call
    assert conn.transport == "h2" and isinstance(conn.batch_lane, H2BatchLane)
    await conn.close()
    monkeypatch.setenv("DANUBE_CLIENT_TRANSPORT", "grpc")
    conn = BrokerConnection("127.0.0.1:1")
    assert conn.transport == "grpc" and isinstance(conn.batch_lane, GrpcBatchLane)
    await conn.close()
    client = DanubeClient.builder().service_url("http://127.0.0.1:1").with_transport("h2").build()
    assert isinstance(client.connection().batch_lane, H2BatchLane)  # the builder wins over the environment
    await client.close()


async def test_a_bad_choice_is_a_clear_error(monkeypatch):
    with pytest.raises(InvalidArgumentError, match="expected one of h2, grpc"):
        DanubeClient.builder().with_transport("quic")
    monkeypatch.setenv("DANUBE_CLIENT_TRANSPORT", "quic")
    with pytest.raises(InvalidArgumentError, match="DANUBE_CLIENT_TRANSPORT"):
        BrokerConnection("127.0.0.1:1")


async def test_secured_connections_use_grpc_unless_h2_is_asked_for(monkeypatch):
    monkeypatch.delenv("DANUBE_CLIENT_TRANSPORT", raising=False)
    conn = BrokerConnection("127.0.0.1:1", with_token(None, "t"))
    assert conn.transport == "grpc" and isinstance(conn.batch_lane, GrpcBatchLane)
    await conn.close()
    conn = BrokerConnection("127.0.0.1:1", with_token(None, "t"), "h2")
    assert conn.transport == "h2" and isinstance(conn.batch_lane, H2BatchLane)
    await conn.close()
