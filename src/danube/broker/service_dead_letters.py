"""BrokerService's dead letters: a message the failure policy gave up on is published, with
Danube's dead-letter attributes, to the subscription's dead-letter topic (here or at its owner).

A base class of :class:`~danube.broker.service.BrokerService` (``broker/service.py``), which
holds the state; its methods are moved here whole.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from danube import message_codec
from danube.broker.contracts import Cluster, RemotePublisher
from danube.broker.salvage import salvage
from danube.broker.subscription import Subscription, cut_frames
from danube.metadata import keys

if TYPE_CHECKING:
    from danube.broker.service import LookupResult

    pass


log = logging.getLogger(__name__)


class DeadLetters:
    if TYPE_CHECKING:  # what this part uses of the rest of BrokerService
        _tasks: set[asyncio.Task]
        cluster: Cluster | None
        remote_publisher: RemotePublisher | None

        async def create_producer(
            self, topic: str, producer_name: str, *, access_mode: str = "shared", reliable: bool = False
        ) -> int: ...
        async def lookup(self, topic: str) -> LookupResult: ...
        async def publish(
            self, producer_id: int, frames_buf: bytearray, *, partitioning_version: int | None = None
        ) -> tuple[int, int]: ...

    # ------------------------------------------------------------ dead letters

    def _dead_letter(self, sub: Subscription, offset: int, *, attempt: int = 1, reason: str | None = None) -> None:
        task = asyncio.get_running_loop().create_task(self._send_dead_letter(sub, offset, attempt, reason))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_dead_letter(self, sub: Subscription, offset: int, attempt: int, reason: str | None) -> None:
        dlq = sub.failure_policy.dead_letter_topic
        try:
            data = await sub.topic.read_frames(offset, 1)
            frame, _ = cut_frames(data, 1, 1)
            # Read leniently: the record may be here because its key or attributes are not UTF-8.
            rec = salvage(frame)
            attrs = dict(rec.attributes)
            # Danube's dead-letter attributes (its poison handler's names and values)
            attrs.update(
                {
                    "x-original-topic": sub.topic.name,
                    "x-original-subscription": sub.name,
                    "x-original-topic-offset": str(offset),
                    "x-original-producer-id": str(rec.producer_id),
                    "x-poison-policy": "dead_letter",
                    "x-delivery-attempt": str(attempt),
                }
            )
            if reason is not None:
                attrs["x-failure-reason"] = reason
            # (a name cut to the rule's 255 characters: "dlq-" + a subscription name may be longer)
            producer_name = f"dlq-{sub.name}"[: keys.MAX_NAME_CHARS]
            if self.cluster is not None:
                found = await self.lookup(dlq)
                # another broker owns the dead-letter topic
                if found.kind == "redirect" and self.remote_publisher is not None:
                    await self.remote_publisher.publish(
                        found.broker_url,
                        dlq,
                        producer_name,
                        bytes(rec.payload),
                        publish_time=rec.publish_time,
                        routing_key=rec.routing_key,
                        attributes=attrs,
                    )
                    log.warning(
                        "message %d of %s moved to dead-letter topic %s (at %s)",
                        offset,
                        sub.topic.name,
                        dlq,
                        found.broker_url,
                    )
                    return
            producer_id = await self.create_producer(dlq, producer_name, reliable=True)
            buf = bytearray(
                message_codec.encode_record(
                    rec.payload,
                    publish_time=rec.publish_time,
                    producer_id=producer_id,
                    key=rec.routing_key,
                    attributes=attrs,
                )
            )
            await self.publish(producer_id, buf)
            log.warning("message %d of %s moved to dead-letter topic %s", offset, sub.topic.name, dlq)
        except Exception:  # noqa: BLE001 - report, the subscription goes on
            log.exception("could not move message %d of %s to dead-letter topic %s", offset, sub.topic.name, dlq)
