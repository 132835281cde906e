"""Per-topic storage: WAL + durable segments (local | shared_fs | object_store), tiered reads, seal/resume.

The broker opens reliable topics only through :class:`StorageFactory`::

    factory = StorageFactory(StorageConfig.from_dict(yaml["storage"], data_dir=...), metadata, broker_id=...)
    storage = await factory.open_topic("/default/orders")
    first, last = storage.append_frames(frames)
    await storage.wait_durable(last)
"""

from danube.storage.config import StorageConfig, StorageConfigError
from danube.storage.factory import StorageFactory
from danube.storage.recovery import StorageStateSealed
from danube.storage.topic_storage import TopicStorage

__all__ = ["StorageConfig", "StorageConfigError", "StorageFactory", "StorageStateSealed", "TopicStorage"]
