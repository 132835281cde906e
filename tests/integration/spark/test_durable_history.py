"""Every acknowledged message reaches what Spark reads: the official danube-client produces to a
real broker, Spark reads the durable root (and, in local mode, the broker's WAL files).

- a graceful stop (SIGTERM) exports every committed message (shared_fs, object_store on a moto S3
  server), with an export interval far longer than the test, so only the stop can have exported
  the active file's tail; in local mode Spark reads the stopped broker's data directory;
- while a broker runs, the newest acknowledged message is in durable history within
  ``export_interval_seconds`` + 2 s, and a kill -9 loses from durable history at most what was
  acknowledged in the last interval (object_store).
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from danube.storage import segment as seg
from danube.storage.backends import backend_from_url
from tests.support.broker import running_broker
from tests.support.danube_client_venv import ensure_venv, start_script
from tests.support.processes import stop_process

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

TOPIC = "/default/history"
COUNT = 20_000


def write_config(tmp_path, mode: str, s3=None, *, export_interval: float) -> str:
    storage = {"mode": mode, "export_interval_seconds": export_interval, "wal": {"max_file_mb": 1}}
    if mode == "shared_fs":
        storage["durable"] = {"root": str(tmp_path / "shared")}
    elif mode == "object_store":
        storage["durable"] = s3.storage_section()
    (tmp_path / "data").mkdir(exist_ok=True)
    path = tmp_path / "broker.yml"
    path.write_text(
        json.dumps({"broker_id": "history-1", "load_manager": {"load_report_interval_seconds": 0}, "storage": storage})
    )
    path.chmod(0o600)  # it may hold S3 credentials: the broker refuses a world-readable one
    return str(path)


def root_and_options(tmp_path, mode: str, s3=None) -> tuple[str, dict]:
    if mode == "object_store":
        return f"s3://{s3.bucket}/danube", {
            "endpoint": s3.endpoint,
            "region": s3.region,
            "access_key": s3.access_key,
            "secret_key": s3.secret_key,
        }
    if mode == "shared_fs":
        return str(tmp_path / "shared"), {}
    return str(tmp_path / "data" / "durable"), {"walRoot": str(tmp_path / "data" / "wal")}


class Producer:
    """produce_window.py in the client venv; acks (count, time) collected from its output as it runs."""

    def __init__(self, url: str, count: int, *, start: int = 0, window: int = 32, report_every: int = 0):
        self.proc = start_script(
            "produce_window.py",
            url,
            TOPIC,
            "--count",
            count,
            "--start",
            start,
            "--window",
            window,
            "--report-every",
            report_every,
        )
        self.acks: list[tuple[int, float]] = []
        self.sent: int | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if "acked" in msg:
                self.acks.append((msg["acked"], msg["t"]))
            elif "sent" in msg:
                self.sent = msg["sent"]

    def wait(self, timeout: float = 600) -> int:
        try:
            self.proc.wait(timeout)
        finally:
            stop_process(self.proc)
        self._reader.join(10)
        assert self.proc.returncode == 0 and self.sent is not None, self.proc.stderr.read()[-3000:]
        return self.sent

    def acked_by(self, t: float) -> int:
        return max((n for n, at in self.acks if at <= t), default=0)


def spark_rows(spark, root: str, options: dict) -> list:
    reader = spark.read.format("danube").option("topic", TOPIC)
    for key, value in options.items():
        reader = reader.option(key, value)
    df = reader.load(root).select("offset", "payload", "routing_key", "attributes")
    return [(r.offset, bytes(r.payload), r.routing_key, dict(r.attributes)) for r in df.collect()]


def assert_history(rows: list, count: int) -> None:
    """Offsets 0..count-1 once each, and every message i sent exactly once with its key and attributes
    (with several sends in flight the broker may store them in another order than i)."""
    rows = sorted(rows)
    assert [r[0] for r in rows] == list(range(count)), "offsets 0..n-1, each once"
    seen = set()
    for offset, payload, key, attrs in rows:
        i = int(payload.decode().rsplit("-", 1)[1])
        assert (key, attrs) == (f"k{i % 7}", {"i": str(i), "kind": "even" if i % 2 == 0 else "odd"}), offset
        seen.add(i)
    assert seen == set(range(count)), "every message sent is there once"


def durable_end(root: str, options: dict) -> int:
    """Last offset of TOPIC's contiguous durable segments (what a listing, as Spark's, shows)."""
    s3 = {k: v for k, v in options.items() if k in ("endpoint", "region", "access_key", "secret_key")}
    backend = backend_from_url(root, **s3)
    end = -1
    for desc in seg.list_segments(backend, seg.topic_prefix(TOPIC)):
        assert desc.start_offset == end + 1, f"segments overlap or leave a gap at {desc.segment_id}"
        end = desc.end_offset
    return end


@pytest.fixture(scope="module", autouse=True)
def client_venv():
    ensure_venv()


@pytest.mark.parametrize("mode", ["shared_fs", "object_store", "local"])
def test_a_graceful_stop_leaves_every_acked_message_to_spark(spark, tmp_path, mode, request):
    s3 = request.getfixturevalue("s3_bucket") if mode == "object_store" else None
    # an interval far beyond the test: only rotations and the stop export anything
    config = write_config(tmp_path, mode, s3, export_interval=3600)
    root, options = root_and_options(tmp_path, mode, s3)
    with running_broker("--config", config, data_dir=str(tmp_path / "data")) as broker:
        assert Producer(broker.url, COUNT).wait() == COUNT
        assert broker.stop() == 0, broker.log()
        log = broker.log()
    assert "stopped cleanly" in log
    if mode != "local":
        assert f"..{COUNT - 1} at shutdown" in log, "the stop exported the active file's tail and said so"
        assert durable_end(root, options) == COUNT - 1
    assert_history(spark_rows(spark, root, options), COUNT)


def test_durable_history_follows_a_running_broker_and_a_kill_loses_at_most_an_interval(spark, tmp_path, s3_bucket):
    interval = 1.0
    config = write_config(tmp_path, "object_store", s3_bucket, export_interval=interval)
    root, options = root_and_options(tmp_path, "object_store", s3_bucket)
    with running_broker("--config", config, data_dir=str(tmp_path / "data")) as broker:
        assert Producer(broker.url, 3000).wait() == 3000
        newest = Producer(broker.url, 1, start=3000, window=1, report_every=1)
        assert newest.wait() == 1
        acked_at = newest.acks[0][1]
        while durable_end(root, options) < 3000:
            assert time.time() - acked_at < interval + 2.0, "the newest acked message is not durable in time"
            time.sleep(0.05)
        visible_after = time.time() - acked_at
        assert_history(spark_rows(spark, root, options), 3001)  # Spark reads it while the broker runs

        busy = Producer(broker.url, 50_000, start=3001, window=8, report_every=100)
        deadline = time.time() + 120
        while (busy.acks[-1][0] if busy.acks else 0) < 4000:
            assert time.time() < deadline and busy.proc.poll() is None, "the producer stalled"
            time.sleep(0.05)
        killed_at = time.time()
        broker.kill()  # SIGKILL: no export at exit
        stop_process(busy.proc)
    # Every ack before killed_at - (interval + 2 s) is durable: acks are a prefix of the offsets'
    # commit order, so n acks mean offsets up to 3001 + n - 1 were committed by then.
    committed_early = 3001 + busy.acked_by(killed_at - interval - 2.0) - 1
    end = durable_end(root, options)
    assert end >= committed_early, (end, committed_early)
    rows = spark_rows(spark, root, options)
    assert [r[0] for r in sorted(rows)] == list(range(end + 1))
    print(
        f"newest acked message durable after {visible_after:.2f}s; kill -9: durable through {end}, "
        f"acked {busy.acked_by(killed_at)} of the busy producer's messages by then"
    )
