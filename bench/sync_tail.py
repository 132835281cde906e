"""Where the publish->deliver tail goes under ``--sync always|interval``: one broker, 100 topics.

    flock /tmp/danube-bench.lock python bench/sync_tail.py [--sync always] [--topics 100]
        [--duration 5] [--rate 25000] [--dirty-mb 0] [--tree SRC]

Runs ``danube broker`` under bench/sync_probe.py (which times each durability wait piece by
piece), then ``danube bench`` with the many-topics shape against it, and prints the bench's
publish->deliver percentiles beside the probe's: waiting for a round to start, the round (and each
``syncfs``), the hand-off back to the event loop, the loop's lag, and the broker's own publish
latency histogram (receipt -> durable and visible) from its metrics page.  ``--dirty-mb N``: a
thread in this process keeps rewriting an N MB file on the WAL's file system during the run
(what other writers on the same file system cost a ``syncfs``).  ``--tree``: the broker's source
tree (another checkout's ``src``); the probe and the bench client are this tree's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
sys.path.insert(0, SRC)

from danube.processes import free_ports, server_process  # noqa: E402


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 2)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def histogram_quantile(text: str, family: str, q: float) -> float:
    """Approximate quantile of a summed-over-labels Prometheus histogram (upper bound of the bucket)."""
    buckets: dict[float, float] = {}
    for m in re.finditer(rf"^{family}_bucket\{{(.*?)\}} (\S+)$", text, re.M):
        le = re.search(r'le="([^"]+)"', m.group(1)).group(1)
        bound = float("inf") if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + float(m.group(2))
    if not buckets:
        return float("nan")
    ordered = sorted(buckets.items())
    total = ordered[-1][1]
    for bound, n in ordered:
        if n >= q * total:
            return bound
    return float("inf")


def counter(text: str, family: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{family}(?:\{{.*?\}})? (\S+)$", text, re.M))


def dirtier(path: str, mb: int, stop: threading.Event) -> None:
    block = os.urandom(1 << 20)
    while not stop.is_set():
        with open(path, "wb") as f:
            for _ in range(mb):
                f.write(block)
        stop.wait(0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sync", default="always")
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--rate", type=int, default=25000)
    ap.add_argument("--dirty-mb", type=int, default=0)
    ap.add_argument("--tree", default=SRC)
    args = ap.parse_args()
    data_dir = tempfile.mkdtemp(prefix="danube-synctail-")
    probe_out = os.path.join(data_dir, "probe.json")
    port, admin_port, metrics_port = free_ports(3)
    cmd = [
        sys.executable,
        os.path.join(HERE, "sync_probe.py"),
        probe_out,
        "broker",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--admin-port",
        str(admin_port),
        "--metrics-port",
        str(metrics_port),
        "--data-dir",
        os.path.join(data_dir, "broker"),
        "--sync",
        args.sync,
    ]
    env_before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = args.tree
    stop = threading.Event()
    try:
        with server_process(cmd, port, stop_timeout=20.0) as proc:
            if args.dirty_mb:
                threading.Thread(
                    target=dirtier, args=(os.path.join(data_dir, "dirty.bin"), args.dirty_mb, stop), daemon=True
                ).start()
            before = scrape(metrics_port)
            n = str(args.topics)
            bench = [
                sys.executable, "-m", "danube.cli.main", "bench",
                "--service-url", f"http://127.0.0.1:{port}", "--broker-pid", str(proc.pid),
                "--json", "--no-progress", "--duration", str(args.duration), "--rate", str(args.rate),
                "--pace-ms", "10", "--topics", n, "--producers", n, "--consumers", n, "--connections", "8",
            ]  # fmt: skip
            out = subprocess.run(bench, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC})
            stop.set()
            time.sleep(1.2)  # the probe's next dump
            after = scrape(metrics_port)
    finally:
        stop.set()
        if env_before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_before
    try:
        result = json.loads(out.stdout)
    except json.JSONDecodeError:
        print(out.stdout[-2000:], out.stderr[-2000:])
        result = {}
    with open(probe_out) as f:
        probe = json.load(f)
    shutil.rmtree(data_dir, ignore_errors=True)
    lat = result.get("deliver_latency_ms", {})
    print(
        f"sync={args.sync} topics={args.topics} dirty_mb={args.dirty_mb}: delivered "
        f"{result.get('delivered')} of {result.get('sent')}  publish->deliver p50 {lat.get('p50')} "
        f"p99 {lat.get('p99')} max {lat.get('max')} ms; ack p99 {result.get('ack_latency_ms', {}).get('p99')} ms"
    )
    rounds = counter(after, "danube_wal_sync_rounds_total") - counter(before, "danube_wal_sync_rounds_total")
    print(
        f"  rounds {rounds:.0f} ({rounds / args.duration:.0f}/s); broker publish latency (receipt->visible) "
        f"p50 <= {histogram_quantile(after, 'danube_producer_send_latency_ms', 0.5)} "
        f"p99 <= {histogram_quantile(after, 'danube_producer_send_latency_ms', 0.99)} ms; "
        f"round latency p99 <= {histogram_quantile(after, 'danube_wal_sync_round_latency_ms', 0.99)} ms"
    )
    for key, values in probe.items():
        if key == "sync_thread_tid":
            continue
        if key == "round_logs":
            print(f"  {key:<14} n {len(values):>6}  p50 {pct(values, 0.5)}  max {max(values, default=0)}")
            continue
        print(
            f"  {key:<14} n {len(values):>6}  p50 {pct(values, 0.5):>7}  p90 {pct(values, 0.9):>7}  "
            f"p99 {pct(values, 0.99):>7}  p99.9 {pct(values, 0.999):>7}  max {pct(values, 1.0):>7}"
        )


if __name__ == "__main__":
    main()
