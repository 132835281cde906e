import contextlib

import pytest

from danube.broker import BrokerService, DispatchSettings, FailurePolicy, TopicPolicies
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory


@pytest.fixture()
def make_broker(tmp_path):
    """Start BrokerServices over real local storage and sqlite metadata in tmp_path (restartable)."""
    started = []

    async def make(**kw):
        metadata = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
        config = StorageConfig.from_dict({"wal": {"sync": "never"}}, data_dir=str(tmp_path))
        factory = StorageFactory(config, metadata, broker_id="test")
        kw.setdefault("dispatch", DispatchSettings(cursor_flush_interval_ms=50))
        kw.setdefault(
            "failure_policy",
            FailurePolicy(ack_timeout_ms=30_000, base_redelivery_delay_ms=50, max_redelivery_delay_ms=400),
        )
        kw.setdefault("policies", TopicPolicies())
        broker = BrokerService(metadata, factory, **kw)
        await broker.start()
        started.append((broker, metadata))
        return broker

    yield make


@pytest.fixture()
async def broker(make_broker):
    b = await make_broker()
    yield b
    with contextlib.suppress(Exception):
        await b.stop()
        await b.metadata.close()


async def stop(broker):
    await broker.stop()
    await broker.metadata.close()
