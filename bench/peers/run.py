"""Side-by-side end-to-end comparison: danube batch lane vs NATS JetStream vs Redis Streams,
plus danube's unary Danube-protocol path vs a bare grpc.aio unary echo server.

    bash bench/peers/setup.sh            # once: nats-server, redis-server, nats-py, redis
    python -m bench.peers.run            # prints one table, writes bench/out/peers-<time>.json

Workload: MESSAGE_SIZE-byte messages, 1 producer + 1 consumer, reliable/persistent storage, each
system driven from Python with batching.  Every system first runs as fast as it can ("max"), then at
half of that rate to measure publish->deliver latency.  Every server runs on free loopback ports and
is stopped by its PID.  See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from dataclasses import asdict

from bench.peers.common import PeerResult

OUT_DIR = os.path.join(os.path.dirname(__file__), "..", "out")


def _loop_runner():
    try:
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        return asyncio.Runner()


def _danube_result(sync: str, res, mode: str) -> PeerResult:
    return PeerResult(f"danube batch lane sync={sync}", mode, sent=res.sent, delivered=res.delivered,
                      seconds=res.elapsed_s, end_to_end_rate=res.end_to_end_rate, publish_rate=res.publish_rate,
                      deliver_latency_ms=res.deliver_latency_ms, ack_latency_ms=res.ack_latency_ms,
                      note="; ".join(res.errors[:2]))


def run_danube(sync: str, args) -> list[PeerResult]:
    from danube.cli.bench import BenchConfig, run_bench, spawned_broker

    out = []
    with spawned_broker(sync) as url:
        config = BenchConfig(service_url=url, message_size=args.message_size, batch_size=args.batch_size,
                             duration=args.duration, progress=False, max_in_flight=8)
        with _loop_runner() as runner:
            res = runner.run(run_bench(config))
            out.append(_danube_result(sync, res, "max"))
            half = res.end_to_end_rate / 2
            config = BenchConfig(service_url=url, message_size=args.message_size, batch_size=args.batch_size,
                                 duration=args.duration, rate=half, progress=False, max_in_flight=8)
            out.append(_danube_result(sync, runner.run(run_bench(config)), f"rate={half:.0f}"))
    return out


def run_peer(name: str, args) -> list[PeerResult]:
    if name == "nats":
        from bench.peers import nats_peer as peer

        server = peer.nats_server
    else:
        from bench.peers import redis_peer as peer

        server = peer.redis_server
    out = []
    with server() as url:
        with _loop_runner() as runner:
            res = runner.run(peer.run(url, message_size=args.message_size, duration=args.duration,
                                      batch=args.batch_size))
            out.append(res)
    with server() as url:   # fresh server: the latency run does not read the first run's backlog
        with _loop_runner() as runner:
            half = res.end_to_end_rate / 2
            out.append(runner.run(peer.run(url, message_size=args.message_size, duration=args.duration,
                                           rate=half, batch=args.batch_size)))
    return out


def run_unary(args) -> list[PeerResult]:
    from bench.peers import danube_unary, grpc_echo
    from danube.cli.bench import spawned_broker

    out = []
    with grpc_echo.echo_server() as address:
        with _loop_runner() as runner:
            out.append(runner.run(grpc_echo.run(address, message_size=args.message_size,
                                                duration=args.duration, concurrency=args.unary_concurrency)))
    with spawned_broker("interval") as url:
        with _loop_runner() as runner:
            out.append(runner.run(danube_unary.run(url, message_size=args.message_size, duration=args.duration,
                                                   concurrency=args.unary_concurrency)))
    return out


def table(results: list[PeerResult]) -> str:
    head = f"{'system':<32} {'mode':<14} {'e2e msg/s':>12} {'publish msg/s':>14} {'deliver p50 ms':>15} {'p99 ms':>9}"
    lines = [head, "-" * len(head)]
    for r in results:
        lat = r.deliver_latency_ms or {}
        lines.append(f"{r.system:<32} {r.mode:<14} {r.end_to_end_rate:>12,.0f} {r.publish_rate:>14,.0f} "
                     f"{lat.get('p50', float('nan')):>15} {lat.get('p99', float('nan')):>9}"
                     + (f"  {r.note}" if r.note and 'baseline' not in r.note and 'unary' not in r.note else ""))
    return "\n".join(lines)


def verdicts(results: list[PeerResult]) -> list[str]:
    by = {(r.system, r.mode if r.mode == "max" else "half"): r for r in results}
    peers = [by.get((s, "max")) for s in ("nats-jetstream", "redis-streams")]
    peers = [p for p in peers if p is not None]
    out = []
    if peers:
        best = max(peers, key=lambda p: p.end_to_end_rate)
        for sync, target in (("interval", 10), ("always", 5)):
            d = by.get((f"danube batch lane sync={sync}", "max"))
            if d and best.end_to_end_rate:
                ratio = d.end_to_end_rate / best.end_to_end_rate
                out.append(f"sync={sync}: {ratio:.1f}x the faster peer ({best.system}); target >= {target}x: "
                           f"{'met' if ratio >= target else 'NOT met'}")
    for sync in ("interval", "always"):
        d = by.get((f"danube batch lane sync={sync}", "half"))
        if d and d.deliver_latency_ms:
            p99 = d.deliver_latency_ms["p99"]
            out.append(f"sync={sync} p99 publish->deliver at half max rate: {p99} ms; target <= 10 ms: "
                       f"{'met' if p99 <= 10 else 'NOT met'}")
    echo = next((r for r in results if r.system.startswith("grpc.aio")), None)
    unary = next((r for r in results if r.system.startswith("danube unary")), None)
    if echo and unary and echo.publish_rate:
        ratio = unary.publish_rate / echo.publish_rate
        out.append(f"danube unary SendMessage: {ratio:.0%} of the bare grpc.aio echo rate; target >= 80%: "
                   f"{'met' if ratio >= 0.8 else 'NOT met'}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--message-size", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=1000, help="messages per batch/pipeline/fetch")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--unary-concurrency", type=int, default=32, help="unary calls in flight")
    parser.add_argument("--only", action="append", choices=["danube", "nats", "redis", "unary"],
                        help="run only these (repeatable)")
    args = parser.parse_args(argv)
    only = set(args.only or ["danube", "nats", "redis", "unary"])
    results: list[PeerResult] = []
    skipped = []
    if "danube" in only:
        for sync in ("interval", "always"):
            print(f"running danube batch lane sync={sync} ...", file=sys.stderr, flush=True)
            results += run_danube(sync, args)
    for name, binary in (("nats", "nats-server"), ("redis", "redis-server")):
        if name not in only:
            continue
        if shutil.which(binary) is None:
            skipped.append(f"{name}: {binary} not installed (bash bench/peers/setup.sh)")
            continue
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results += run_peer(name, args)
    if "unary" in only:
        print("running unary echo baseline and danube unary ...", file=sys.stderr, flush=True)
        results += run_unary(args)
    print(table(results))
    for line in verdicts(results) + [f"skipped {s}" for s in skipped]:
        print(line)
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, f"peers-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump({"args": vars(args), "cpu_count": os.cpu_count(), "results": [asdict(r) for r in results],
                   "verdicts": verdicts(results), "skipped": skipped}, f, indent=2)
    print(f"JSON: {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
