"""Danube's client health check: how a producer or consumer notices its topic moved.

Every ``interval_s`` the watch asks the broker that currently serves the
producer or consumer ``HealthCheck(client type, id)``.  ``CLOSE`` means the
broker dropped it (the topic was unloaded, moved or deleted), so the owner is
told to look the topic up again and re-create itself there.  A failed check
(broker unreachable) is not acted on here: the owner's stream fails too and
its own reconnection handles that.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from danube._tasks import cancel_and_wait
from danube.proto.danube import DanubeApi_pb2 as danube_pb

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0

ClientType = danube_pb.HealthCheckRequest.ClientType
PRODUCER = danube_pb.HealthCheckRequest.Producer
CONSUMER = danube_pb.HealthCheckRequest.Consumer


class HasHealthStub(Protocol):
    """A broker connection: its ``health`` is a ``HealthCheckStub``."""

    health: Any


# (connection to ask, or None while not connected; the id the broker gave, or -1)
Target = Callable[[], tuple[HasHealthStub | None, int]]


class HealthWatch:
    """One polling task per producer/consumer (per partition); ``stop()`` ends it."""

    def __init__(
        self, client_type: ClientType, target: Target, on_close: Callable[[], None], *, interval_s: float, what: str
    ) -> None:
        self.client_type = client_type
        self.interval_s = interval_s
        self.what = what
        self._target = target
        self._on_close = on_close
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self._task is None and self.interval_s and self.interval_s > 0:
            self._task = asyncio.ensure_future(self._run())

    def cancel(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def check_once(self) -> bool | None:
        """True: OK; False: CLOSE; None: could not ask (not connected, broker unreachable)."""
        conn, client_id = self._target()
        if conn is None or client_id < 0:
            return None
        request = danube_pb.HealthCheckRequest(request_id=0, client=self.client_type, id=client_id)
        try:
            answer = await conn.health.HealthCheck(request, timeout=max(1.0, min(self.interval_s, 10.0)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - unreachable broker, closed channel: the stream handles it
            log.debug("health check of %s failed: %s", self.what, exc)
            return None
        return answer.status != danube_pb.HealthCheckResponse.CLOSE

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if await self.check_once() is False:
                log.info("broker answered CLOSE for %s: looking the topic up again", self.what)
                try:
                    self._on_close()
                except Exception:  # noqa: BLE001 - keep watching
                    log.exception("reacting to CLOSE for %s failed", self.what)
