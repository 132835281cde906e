"""A real BrokerService (WAL storage, embedded metadata) behind a grpc.aio server in the test's process."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator, Callable

import grpc

from danube.broker import BrokerService
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory


@contextlib.asynccontextmanager
async def served_broker(
    data_dir, add_to_server: Callable, *, sync: str, **broker_options
) -> AsyncIterator[tuple[BrokerService, grpc.aio.Channel]]:
    """``(broker, channel)``: the broker's services added by ``add_to_server`` on a free 127.0.0.1 port."""
    metadata = EmbeddedMetadataStore(str(data_dir / "metadata.db"))
    factory = StorageFactory(
        StorageConfig.from_dict({"wal": {"sync": sync}}, data_dir=str(data_dir)), metadata, broker_id="test"
    )
    broker = BrokerService(metadata, factory, **broker_options)
    await broker.start()
    server = grpc.aio.server()
    add_to_server(server, broker)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield broker, channel
    finally:
        await channel.close()
        await server.stop(None)
        with contextlib.suppress(Exception):
            await broker.stop()
            await metadata.close()
