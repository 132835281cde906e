"""Automatic splitting of a scalable topic's busiest segment, done by the topic's controller leader
(optional: off unless ``auto_split_rate`` > 0).

Every ``auto_split_interval`` seconds the leader reads each active segment's ``messages_in`` and
splits the busiest one whose publish rate since the last look exceeds ``auto_split_rate``
messages/s: at most one split a look, none beyond ``max_segments`` active segments.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from danube.model.segment_layout import segment_topic_name
from danube.routing.scalable.leader_ticker import LeaderTicker

if TYPE_CHECKING:
    from danube.routing.scalable.controller import ScalableTopicController

log = logging.getLogger(__name__)


class AutoSplitter(LeaderTicker):
    """The automatic splits of one controller's topic (acts only while the controller leads)."""

    what = "automatic split check"

    def __init__(
        self, ctl: ScalableTopicController, *, auto_split_rate: float, auto_split_interval: float, max_segments: int
    ) -> None:
        super().__init__(ctl, auto_split_interval)
        self.auto_split_rate = auto_split_rate  # msgs/s of one active segment that triggers a split; 0 = off
        self.max_segments = max_segments
        self._rates: dict[int, tuple[float, int]] = {}  # segment id -> (time, messages_in) last seen

    def enabled(self) -> bool:
        return self.auto_split_rate > 0

    def elected(self) -> None:
        """The controller became the leader: look periodically when configured."""
        self.start_ticking()

    async def tick(self, now: float) -> int | None:
        """Split the busiest active segment whose publish rate since the last tick exceeds
        ``auto_split_rate`` (at most one split a tick, up to ``max_segments``); its id, or None."""
        ctl = self.ctl
        if not ctl.is_leader or self.auto_split_rate <= 0 or ctl.layout is None:
            return None
        active = ctl.layout.active_segments
        busiest: tuple[float, int] | None = None
        for seg in active:
            stats = await ctl.ops.segment_stats(segment_topic_name(ctl.topic, seg))
            count = int(stats.get("messages_in", 0))
            seen = self._rates.get(seg.segment_id)
            self._rates[seg.segment_id] = (now, count)
            if seen is None or count < seen[1] or now <= seen[0]:
                continue  # first sight, or the counter restarted (the segment moved)
            rate = (count - seen[1]) / (now - seen[0])
            if rate > self.auto_split_rate and seg.hash_range.size > 1 and (busiest is None or rate > busiest[0]):
                busiest = (rate, seg.segment_id)
        if busiest is None or len(active) >= self.max_segments:
            return None
        log.info(
            "automatic split of segment %d of %s: %.0f msg/s > %.0f",
            busiest[1],
            ctl.topic,
            busiest[0],
            self.auto_split_rate,
        )
        await ctl.split_segment(busiest[1])
        return busiest[1]
