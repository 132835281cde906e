"""What the broker's edges consult for live repartition: one object per broker, built on demand.

``for_broker(broker)`` returns the broker's :class:`RepartitionRuntime` (the version fence, later
the topology hub and the delivery gate), creating it on first use and keeping it as
``broker.repartition``.  It needs the broker's metadata store and nothing else, so the batch lane
reaches it with one ``getattr`` and the broker's own code stays untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from danube.routing.repartition.fence import NeedsCatchUp, PartitionFence, StaleRoutingError
from danube.routing.repartition.store import RepartitionStore

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 0.5


class RepartitionRuntime:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.store = RepartitionStore(broker.metadata)
        self.fence = PartitionFence(self.store, next_offset=self._next_offset, owner_url=self._owner_url)
        self._sweeper: asyncio.Task | None = None

    def _next_offset(self, name: str) -> int | None:
        topic = self.broker.topics.get(name)
        if topic is None or getattr(topic, "closed", False):
            return None
        return topic.storage.next_offset

    def _owner_url(self, name: str) -> str | None:
        cluster = getattr(self.broker, "cluster", None)
        view = getattr(cluster, "view", None)
        if view is None:
            return getattr(self.broker, "broker_url", None)
        owner = view.owner(name)
        return view.broker_url(owner) if owner else None

    def start(self) -> None:
        self.fence.start()
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())
            # the broker cancels its background tasks when it stops
            tasks = getattr(self.broker, "_tasks", None)
            if isinstance(tasks, set):
                for task in (self.fence._task, self._sweeper):
                    if task is not None:
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)

    async def stop(self) -> None:
        await self.fence.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                self.fence.sweep()
            except Exception:   # noqa: BLE001
                log.warning("repartition sweep failed", exc_info=True)

    # ------------------------------------------------------------ the batch lane's publish hook

    async def admit(self, name: str, version: int):
        """The fence for one batch (see PartitionFence.admit); waits for the first snapshot once."""
        fence = self.fence
        if not fence._ready.is_set():
            self.start()
            await fence.ready()
        try:
            return fence.admit(name, version)
        except NeedsCatchUp:
            return await fence.admit_async(name, version)


def for_broker(broker: Any) -> RepartitionRuntime | None:
    runtime = getattr(broker, "repartition", None)
    if runtime is None and getattr(broker, "metadata", None) is not None:
        runtime = RepartitionRuntime(broker)
        broker.repartition = runtime
    return runtime


__all__ = ["RepartitionRuntime", "StaleRoutingError", "for_broker"]
