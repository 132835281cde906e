"""A look a scalable topic's controller leader takes every few seconds while it leads, in one task
(automatic splits and pruning are two)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from danube._tasks import cancel_and_wait

if TYPE_CHECKING:
    from danube.routing.scalable.controller import ScalableTopicController

log = logging.getLogger(__name__)


class LeaderTicker:
    """Calls ``tick(now)`` every ``interval`` seconds while ``ctl`` leads and ``enabled()``; a failed
    tick is logged (as ``what``) and tried again at the next."""

    what = "periodic check"

    def __init__(self, ctl: ScalableTopicController, interval: float) -> None:
        self.ctl = ctl
        self.interval = interval
        self._task: asyncio.Task | None = None

    def enabled(self) -> bool:
        return self.interval > 0

    def start_ticking(self) -> None:
        if self.enabled() and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"scalable-{type(self).__name__}-{self.ctl.topic}"
            )

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def tick(self, now: float) -> Any:
        raise NotImplementedError

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self.ctl.is_leader:
            await asyncio.sleep(self.interval)
            try:
                await self.tick(loop.time())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - try again next tick
                log.warning("%s of %s: %s", self.what, self.ctl.topic, exc)
