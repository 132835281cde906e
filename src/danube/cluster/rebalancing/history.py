"""Rebalancing history: one record per automated move under ``/cluster/rebalancing_history/{ms}``.

The history is the rebalancer's only memory, so every safety rule that spans
cycles survives a leader change (the new leader reads the same records):

- rate limit: at most ``max_moves_per_hour`` records in the last 3600 s;
- cooldown between moves: none within ``cooldown_seconds`` of the last record;
- topic cooldown: a topic moved within ``cooldown_seconds`` is not a candidate;
- anti-oscillation: a topic is not moved back to a broker it left within the last hour.

Record (JSON; the fields of Danube's rebalancing history first)::

    {"topic": "/default/t", "from_broker": "1", "to_broker": "3", "reason": "LoadImbalance",
     "estimated_load": 15.3, "timestamp": 1700000000.0,
     "planned_to_broker": "3", "cv_before": 0.41, "cv_after_estimated": 0.35,
     "strategy": "balanced", "outcome": "moved" | "timeout"}

``to_broker`` is where the topic was actually assigned (``planned_to_broker`` the
hint); ``outcome`` is ``timeout`` when no broker took the topic in time (it was
unloaded all the same, so it counts toward the rate limit).  Records older than
``retention_seconds`` (default 7 days) are pruned by the leader.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

from danube.metadata import keys
from danube.metadata.store import Compare, MetadataStore, Op

from .config import OSCILLATION_WINDOW_SECONDS, RATE_WINDOW_SECONDS

log = logging.getLogger(__name__)

DEFAULT_RETENTION_SECONDS = 7 * 86400.0


@dataclass(frozen=True)
class MoveRecord:
    topic: str
    from_broker: str
    to_broker: str
    timestamp: float
    estimated_load: float = 0.0
    reason: str = "LoadImbalance"
    planned_to_broker: str = ""
    cv_before: float = 0.0
    cv_after_estimated: float = 0.0
    strategy: str = "balanced"
    outcome: str = "moved"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MoveRecord":
        return cls(
            topic=str(data["topic"]),
            from_broker=str(data["from_broker"]),
            to_broker=str(data.get("to_broker", "")),
            timestamp=float(data["timestamp"]),
            estimated_load=float(data.get("estimated_load", 0.0) or 0.0),
            reason=str(data.get("reason", "LoadImbalance")),
            planned_to_broker=str(data.get("planned_to_broker", data.get("to_broker", ""))),
            cv_before=float(data.get("cv_before", 0.0) or 0.0),
            cv_after_estimated=float(data.get("cv_after_estimated", 0.0) or 0.0),
            strategy=str(data.get("strategy", "balanced")),
            outcome=str(data.get("outcome", "moved")),
        )


# ---------------------------------------------------------------- pure rules over a list of records


def moves_in_window(records: Iterable[MoveRecord], now: float, window: float = RATE_WINDOW_SECONDS) -> int:
    """Records newer than now − window (a record "from the future", written by a leader whose clock
    is ahead of this one's, counts too)."""
    return sum(1 for r in records if now - window < r.timestamp)


def remaining_budget(records: Iterable[MoveRecord], now: float, max_moves_per_hour: int) -> int:
    return max(0, max_moves_per_hour - moves_in_window(records, now))


def last_move_time(records: Sequence[MoveRecord]) -> float | None:
    return max((r.timestamp for r in records), default=None)


def in_cooldown(records: Sequence[MoveRecord], now: float, cooldown_seconds: float) -> bool:
    """True while the last move is less than ``cooldown_seconds`` old."""
    last = last_move_time(records)
    return last is not None and now - last < cooldown_seconds


def recently_moved(records: Iterable[MoveRecord], now: float, cooldown_seconds: float) -> set[str]:
    """Topics moved within the last ``cooldown_seconds``."""
    return {r.topic for r in records if now - r.timestamp < cooldown_seconds}


def forbidden_returns(
    records: Iterable[MoveRecord], now: float, window: float = OSCILLATION_WINDOW_SECONDS
) -> dict[str, set[str]]:
    """topic → brokers it left within ``window``: it is not moved back there."""
    out: dict[str, set[str]] = {}
    for r in records:
        if now - r.timestamp < window:
            out.setdefault(r.topic, set()).add(r.from_broker)
    return out


# ---------------------------------------------------------------- the store


class RebalancingHistory:
    def __init__(self, store: MetadataStore, *, retention_seconds: float = DEFAULT_RETENTION_SECONDS) -> None:
        self.store = store
        self.retention_seconds = retention_seconds

    async def records(self, *, since: float | None = None) -> list[MoveRecord]:
        """Every record (or those at/after ``since``), oldest first; unreadable ones are skipped."""
        out = []
        for kv in await self.store.get_prefix(keys.rebalancing_history_prefix()):
            try:
                record = MoveRecord.from_dict(json.loads(kv.value))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("skipping unreadable rebalancing history record %s: %s", kv.key, exc)
                continue
            if since is None or record.timestamp >= since:
                out.append(record)
        out.sort(key=lambda r: r.timestamp)
        return out

    async def append(self, record: MoveRecord, *, guard: Sequence[Compare] = ()) -> str | None:
        """Write ``record`` under a new key (its time in ms, +1 ms on a collision).

        ``guard``: comparisons that must hold (the leader's); returns the key, or
        None when the guard failed (this broker is no longer the leader).
        """
        ms = int(round(record.timestamp * 1000))
        value = json.dumps(record.to_dict(), separators=(",", ":"), sort_keys=True).encode()
        for _ in range(1000):
            key = keys.rebalancing_history(ms)
            result = await self.store.txn([*guard, Compare.version(key, "==", 0)], [Op.put(key, value)], [Op.get(key)])
            if result.succeeded:
                return key
            if result.results and result.results[0] is None:
                return None  # the key is free: the guard failed
            ms += 1
        raise RuntimeError("no free rebalancing history key")

    async def prune(self, now: float) -> int:
        """Delete records older than the retention; the number deleted."""
        cutoff = keys.rebalancing_history(int((now - self.retention_seconds) * 1000))
        deleted = 0
        for kv in await self.store.get_prefix(keys.rebalancing_history_prefix()):
            if kv.key >= cutoff:
                break
            if await self.store.delete(kv.key):
                deleted += 1
        return deleted
