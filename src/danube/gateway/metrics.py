"""Broker metrics for the pages: the latest scrape of every broker's Prometheus port, a bounded
embedded history of per-topic counters (the charts without a Prometheus), and Prometheus range
queries when ``--prometheus-url`` is given.

Fetches run in a worker thread (urllib) so the event loop never blocks on a slow metrics port.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import time
import urllib.parse
import urllib.request
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from danube.errors import InvalidArgumentError
from danube.server.rpc_counts import SERVER_ERROR_CODES

log = logging.getLogger("danube.gateway")

MAX_SCRAPE_BYTES = 16 * 1024 * 1024
MAX_SERIES_POINTS = 11_000  # Prometheus's own limit for one range query
RATE_WINDOW_S = 60.0  # the charts' "_1m" rates, as Danube's gateway asks Prometheus
_SERVER_ERRORS = frozenset(code.name for code in SERVER_ERROR_CODES)


@dataclass
class TopicSample:
    """One topic's values in one scrape (counters are totals since the topic loaded on its broker)."""

    msg_in: float = 0.0
    bytes_in: float = 0.0
    msg_out: float = 0.0
    bytes_out: float = 0.0
    producers: float = 0.0
    consumers: float = 0.0
    backlog: float = 0.0
    unacked: float = 0.0
    subscriptions: dict = field(default_factory=dict)  # name -> {"backlog", "unacked", "acks", ...}
    latency_buckets: list = field(default_factory=list)  # [(le, cumulative count)]
    latency_count: float = 0.0
    wal: dict = field(default_factory=dict)  # next_offset, first_offset, durable_offset
    wal_flush_total: float = 0.0
    wal_flush_buckets: list = field(default_factory=list)  # [(le, cumulative count)]


@dataclass
class BrokerSample:
    url: str
    at: float
    topics: dict = field(default_factory=dict)  # topic -> TopicSample
    topics_owned: float = 0.0
    rpc_total: float = 0.0  # calls answered (danube_broker_rpc_total)
    rpc_errors: float = 0.0  # of them, answered with a status other than OK
    rpc_server_errors: float = 0.0  # of those, the server's failures (errors_5xx_total)
    wal_sync_rounds: float = 0.0
    wal_round_buckets: list = field(default_factory=list)  # [(le, cumulative count)]
    error: str | None = None

    def totals(self) -> dict:
        t = self.topics.values()
        return {
            "bytes_in_total": sum(s.bytes_in for s in t),
            "bytes_out_total": sum(s.bytes_out for s in t),
            "msg_in_total": sum(s.msg_in for s in t),
            "msg_out_total": sum(s.msg_out for s in t),
            "active_connections": int(sum(s.producers + s.consumers for s in t)),
        }


def parse_exposition(text: str, url: str, at: float) -> BrokerSample:
    """A broker's /metrics page as per-topic samples (the families danube.server.metrics exports)."""
    sample = BrokerSample(url=url, at=at)

    def topic(labels) -> TopicSample | None:
        name = labels.get("topic")
        if not name:
            return None
        return sample.topics.setdefault(name, TopicSample())

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name, labels, value = s.name, s.labels, s.value
            if name == "danube_broker_topics_owned":
                sample.topics_owned = max(sample.topics_owned, value)
                continue
            if name == "danube_broker_rpc_total":
                sample.rpc_total += value
                if labels.get("result") == "error":
                    sample.rpc_errors += value
                    if labels.get("code") in _SERVER_ERRORS:
                        sample.rpc_server_errors += value
                continue
            if name == "danube_wal_sync_rounds_total":
                sample.wal_sync_rounds += value
                continue
            if name == "danube_wal_sync_round_latency_ms_bucket":
                sample.wal_round_buckets.append((float(labels.get("le", "inf")), value))
                continue
            t = topic(labels)
            if t is None:
                continue
            sub = labels.get("subscription")
            if name == "danube_topic_messages_in_total":
                t.msg_in += value
            elif name == "danube_topic_bytes_in_total":
                t.bytes_in += value
            elif name == "danube_consumer_messages_out_total":
                t.msg_out += value
            elif name == "danube_consumer_bytes_out_total":
                t.bytes_out += value
            elif name == "danube_topic_producers":
                t.producers += value
            elif name == "danube_topic_consumers":
                t.consumers += value
            elif name == "danube_subscription_backlog_messages":
                t.backlog += value
                if sub:
                    t.subscriptions.setdefault(sub, {})["backlog"] = int(value)
            elif name == "danube_subscription_unacked_messages":
                t.unacked += value
                if sub:
                    t.subscriptions.setdefault(sub, {})["unacked"] = int(value)
            elif name == "danube_subscription_acks_total" and sub:
                t.subscriptions.setdefault(sub, {})["acks_total"] = int(value)
            elif name == "danube_subscription_redeliveries_total" and sub:
                t.subscriptions.setdefault(sub, {})["redeliveries_total"] = int(value)
            elif name == "danube_producer_send_latency_ms_bucket":
                t.latency_buckets.append((float(labels.get("le", "inf")), value))
            elif name == "danube_producer_send_latency_ms_count":
                t.latency_count += value
            elif name == "danube_wal_flush_total":
                t.wal_flush_total += value
            elif name == "danube_wal_flush_latency_ms_bucket":
                t.wal_flush_buckets.append((float(labels.get("le", "inf")), value))
            elif name in ("danube_wal_next_offset", "danube_wal_first_offset", "danube_wal_durable_offset"):
                t.wal[name[len("danube_wal_") :]] = int(value)
    return sample


def quantile(buckets: list, q: float) -> float:
    """histogram_quantile over cumulative (le, count) buckets, linear inside a bucket."""
    if not buckets:
        return 0.0
    merged: dict[float, float] = {}
    for le, count in buckets:
        merged[le] = merged.get(le, 0.0) + count
    points = sorted(merged.items())
    total = points[-1][1]
    if total <= 0:
        return 0.0
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in points:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def _http_get(url: str, timeout: float, limit: int = MAX_SCRAPE_BYTES) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - operator-given http(s) URL
        body = resp.read(limit + 1)
    if len(body) > limit:
        raise ValueError(f"{url}: more than {limit} bytes")
    return body


def metrics_page_url(addr: str) -> str:
    if not addr.startswith(("http://", "https://")):
        addr = "http://" + addr
    addr = addr.replace("://0.0.0.0", "://127.0.0.1")
    return addr.rstrip("/") + ("" if addr.rstrip("/").endswith("/metrics") else "/metrics")


# (timestamp, msg_in, msg_out, bytes_in, bytes_out, backlog, producers, consumers)
_FIELDS = {"msg_in": 1, "msg_out": 2, "bytes_in": 3, "bytes_out": 4, "backlog": 5, "producers": 6, "consumers": 7}


class History:
    """Bounded per-topic history: at most ``max_topics`` topics (least recently scraped dropped
    first), each a ring of the samples of the last ``retention_s`` seconds."""

    def __init__(self, retention_s: float, interval_s: float, max_topics: int) -> None:
        self.retention_s = retention_s
        self.max_points = max(2, int(retention_s / max(interval_s, 0.1)) + 2)
        self.max_topics = max_topics
        self._topics: OrderedDict[str, deque] = OrderedDict()

    def __len__(self) -> int:
        return len(self._topics)

    def record(self, at: float, topics: dict) -> None:
        for name, t in topics.items():
            ring = self._topics.pop(name, None)
            if ring is None:
                ring = deque(maxlen=self.max_points)
            ring.append((at, t.msg_in, t.msg_out, t.bytes_in, t.bytes_out, t.backlog, t.producers, t.consumers))
            self._topics[name] = ring  # most recently scraped last
        while len(self._topics) > self.max_topics:
            self._topics.popitem(last=False)
        horizon = at - self.retention_s
        for name in [n for n, ring in self._topics.items() if ring and ring[-1][0] < horizon]:
            del self._topics[name]

    def series(self, topic: str, start: float, end: float, step: float) -> dict[str, list]:
        """Rates over the last minute (counters) and gauges, one point per step where data exists."""
        ring = list(self._topics.get(topic, ()))
        out: dict[str, list] = {
            "publish_rate_1m": [],
            "dispatch_rate_1m": [],
            "bytes_in_rate_1m": [],
            "bytes_out_rate_1m": [],
            "backlog_messages": [],
        }
        if not ring:
            return out
        times = [r[0] for r in ring]
        t = start
        while t <= end + 1e-9:
            i = bisect.bisect_right(times, t) - 1
            if i >= 0 and t - times[i] <= max(step, 2 * RATE_WINDOW_S):
                now = ring[i]
                j = max(0, bisect.bisect_right(times, t - RATE_WINDOW_S) - 1)
                then = ring[j]
                ts = int(t)
                out["backlog_messages"].append([ts, now[_FIELDS["backlog"]]])
                if j < i:
                    dt = now[0] - then[0]
                    for key, field_name in (
                        ("publish_rate_1m", "msg_in"),
                        ("dispatch_rate_1m", "msg_out"),
                        ("bytes_in_rate_1m", "bytes_in"),
                        ("bytes_out_rate_1m", "bytes_out"),
                    ):
                        k = _FIELDS[field_name]
                        delta = now[k] - then[k]
                        if delta < 0:  # the counter restarted (the topic moved or reloaded)
                            delta = now[k]
                        out[key].append([ts, delta / dt if dt > 0 else 0.0])
            t += step
        return out


def parse_step(text: str | None) -> float:
    """Prometheus-style step: 15, 15s, 1m, 1h (Danube's UI sends 15s, 30s, 1m)."""
    text = (text or "15s").strip()
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        value = float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError):
        raise InvalidArgumentError(f"step {text[:20]!r}: expected seconds or 15s, 1m, 1h") from None
    if not value > 0:
        raise InvalidArgumentError("step must be positive")
    return value


def clamp_range(start: float | None, end: float | None, step: float, now: float) -> tuple[float, float]:
    """Danube's bounds: from within the last 24 h, to after from and not in the future."""
    start = now - 900 if start is None else start
    end = now if end is None else end
    start = min(max(start, now - 24 * 3600), now)
    end = min(max(end, start + 1), now)
    if (end - start) / step > MAX_SERIES_POINTS:
        raise InvalidArgumentError(f"at most {MAX_SERIES_POINTS} points per series: use a larger step")
    return start, end


class MetricsHub:
    """The brokers' latest scrapes, the embedded history, and the Prometheus client."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.latest: dict[str, BrokerSample] = {}  # broker id (or URL) -> last scrape
        self.history = History(cfg.history_s, cfg.scrape_interval_s, cfg.max_history_topics)
        # per broker: (scrape time, calls answered) over the rate window, for rpc_rate_1m
        self._rpc_points: dict[str, deque] = {}
        self._rpc_points_max = max(2, int(RATE_WINDOW_S / max(cfg.scrape_interval_s, 0.1)) + 2)
        self.scrapes = 0
        self._lock = asyncio.Lock()

    async def scrape(self, targets: dict[str, str]) -> None:
        """One round over ``targets`` (broker id -> metrics URL); the history records what came back."""
        async with self._lock:
            timeout = min(self.cfg.request_timeout_s, 5.0)

            async def one(key: str, url: str) -> BrokerSample:
                at = time.time()
                try:
                    body = await asyncio.to_thread(_http_get, url, timeout)
                    return await asyncio.to_thread(parse_exposition, body.decode("utf-8", "replace"), url, at)
                except Exception as exc:  # an unreachable metrics port is shown on the page, not raised
                    return BrokerSample(url=url, at=at, error=f"{url}: {exc}")

            keys = list(targets)
            samples = await asyncio.gather(*(one(k, targets[k]) for k in keys))
            merged: dict = {}
            for key, sample in zip(keys, samples):
                self.latest[key] = sample
                merged.update(sample.topics)
                if sample.error is None:
                    points = self._rpc_points.get(key)
                    if points is None:
                        points = self._rpc_points[key] = deque(maxlen=self._rpc_points_max)
                    points.append((sample.at, sample.rpc_total))
            for gone in set(self.latest) - set(targets):
                del self.latest[gone]
                self._rpc_points.pop(gone, None)
            if merged and not self.cfg.prometheus_url:
                self.history.record(time.time(), merged)
            self.scrapes += 1

    def topic(self, name: str) -> TopicSample | None:
        found = [s.topics[name] for s in self.latest.values() if name in s.topics]
        if not found:
            return None
        # a topic that just moved may show on two brokers: the busier sample is the live one
        return max(found, key=lambda t: (t.producers + t.consumers, t.msg_in))

    def rpc_rate(self, key: str) -> float:
        """Calls answered per second by broker ``key`` over the last minute of scrapes (0 until two)."""
        points = self._rpc_points.get(key)
        if not points or len(points) < 2:
            return 0.0
        now_at, now_total = points[-1]
        then_at, then_total = next(p for p in points if now_at - p[0] <= RATE_WINDOW_S)
        if now_at <= then_at:
            return 0.0
        delta = now_total - then_total
        if delta < 0:  # the broker restarted
            delta = now_total
        return delta / (now_at - then_at)

    def errors(self) -> list[str]:
        return [s.error for s in self.latest.values() if s.error]

    def rates(self, topic: str) -> tuple[float, float]:
        now = time.time()
        s = self.history.series(topic, now, now, 1.0)
        pub = s["publish_rate_1m"][-1][1] if s["publish_rate_1m"] else 0.0
        disp = s["dispatch_rate_1m"][-1][1] if s["dispatch_rate_1m"] else 0.0
        return pub, disp

    # ------------------------------------------------------------ Prometheus

    async def prometheus_range(self, query: str, start: float, end: float, step: float) -> list:
        url = (
            self.cfg.prometheus_url.rstrip("/")
            + "/api/v1/query_range?"
            + urllib.parse.urlencode({"query": query, "start": int(start), "end": int(end), "step": step})
        )
        body = await asyncio.to_thread(_http_get, url, self.cfg.request_timeout_s)
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise ValueError(doc.get("error") or "prometheus query failed")
        return [
            (r.get("metric", {}), [[int(float(t)), float(v)] for t, v in r.get("values", [])])
            for r in doc.get("data", {}).get("result", [])
        ]

    async def prometheus_series(self, topic: str, start: float, end: float, step: float) -> tuple[list, list]:
        # topic names passed the broker's name rule: no quote or backslash can reach the query
        sel = f'topic="{topic}"'
        queries = {
            "publish_rate_1m": f"sum(rate(danube_topic_messages_in_total{{{sel}}}[1m]))",
            "dispatch_rate_1m": f"sum(rate(danube_consumer_messages_out_total{{{sel}}}[1m]))",
            "bytes_in_rate_1m": f"sum(rate(danube_topic_bytes_in_total{{{sel}}}[1m]))",
            "bytes_out_rate_1m": f"sum(rate(danube_consumer_bytes_out_total{{{sel}}}[1m]))",
            "backlog_messages": f"sum(danube_subscription_backlog_messages{{{sel}}})",
        }
        series, errors = [], []
        for name, query in queries.items():
            try:
                results = await self.prometheus_range(query, start, end, step)
            except Exception as exc:
                errors.append(f"{name} {exc}")
                continue
            series.append({"name": name, "labels": None, "points": results[0][1] if results else []})
        return series, errors
