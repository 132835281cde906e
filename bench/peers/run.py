"""Side-by-side end-to-end comparison: danube batch lane vs NATS JetStream vs Redis Streams,
plus danube's unary Danube-protocol path vs a bare grpc.aio unary echo server.

    bash bench/peers/setup.sh            # once: nats-server, redis-server, nats-py, redis
    python -m bench.peers.run            # prints one table, writes bench/out/peers-<time>.json

Workload: MESSAGE_SIZE-byte messages, 1 producer + 1 consumer, reliable/persistent storage, each
system driven from Python with batching, producer and consumer in one client process (one event
loop), at a rate one send every 5 ms carrying that interval's messages (common.paced_chunk).
Every system first runs as fast as it can ("max"), then at half of that rate to measure
publish->deliver latency; danube's runs are repeated (``--repeat``) and medians reported.  The
unary rows drive Danube's ``SendMessage`` with the real ``danube-client`` 0.5.0 (its venv) against
the broker and against a bare grpc.aio server, plus a raw grpc.aio echo, interleaved in rounds
(``--unary-rounds``, default 5; medians reported; bench/peers/danube_unary.py).
Every server runs on free loopback ports and is stopped by its PID.
See docs/benchmarks.md.
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

from bench.peers.common import PEER_PACE_MS, PeerResult, paced_chunk
from danube import _allocator
from danube.cli._machine import describe, observe
from danube.server.config import GRPC_SERVER_ALIASES, GRPC_SERVERS

OUT_DIR = os.path.join(os.path.dirname(__file__), "..", "out")


def _loop_runner():
    try:
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        return asyncio.Runner()


def _danube_result(sync: str, runs: list, mode: str) -> PeerResult:
    """Medians over repeated runs (each metric on its own); every run's figures go in the note."""
    import statistics

    def med(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 3) if values else None

    def lat(which: str) -> dict:
        per_run = [getattr(r, which) for r in runs if getattr(r, which)]
        keys = ("p50", "p90", "p99", "p999", "max")
        return {k: med([d.get(k) for d in per_run]) for k in keys} if per_run else {}

    errors = [e for r in runs for e in r.errors]
    per_run = ", ".join(
        f"{r.end_to_end_rate:,.0f}/s p99 {r.deliver_latency_ms.get('p99')} ms "
        f"p99.9 {r.deliver_latency_ms.get('p999')} ms steal {r.machine.get('steal_pct')}% "
        f"I/O pressure {r.machine.get('io_pressure_pct')}%"
        for r in runs
    )
    calls = f"; {runs[0].messages_per_call} msgs per send_batch" if runs and runs[0].messages_per_call else ""
    return PeerResult(
        f"danube batch lane sync={sync}",
        mode,
        sent=sum(r.sent for r in runs),
        delivered=sum(r.delivered for r in runs),
        seconds=round(sum(r.elapsed_s for r in runs), 3),
        end_to_end_rate=med([r.end_to_end_rate for r in runs]),
        publish_rate=med([r.publish_rate for r in runs]),
        deliver_latency_ms=lat("deliver_latency_ms"),
        ack_latency_ms=lat("ack_latency_ms"),
        note=f"median of {len(runs)} runs [{per_run}]{calls}" + (f"; {'; '.join(errors[:2])}" if errors else ""),
    )


def run_danube(sync: str, args) -> list[PeerResult]:
    """``repeat`` runs as fast as possible, then ``repeat`` runs at half the median maximum rate."""
    import statistics

    from danube.cli._process import spawned_broker
    from danube.cli.bench import BenchConfig, run_bench

    def config(rate: float = 0.0) -> BenchConfig:
        # Driven like the peers: producer and consumer in this one process, and at a rate one call
        # every PEER_PACE_MS carrying that interval's messages (common.paced_chunk), --batch-size
        # or more.  Capping paced calls at --batch-size made danube's calls come every 2.6 ms at
        # 385k msg/s while the peers' came every 5 ms (docs/benchmarks.md, "Half-rate point, pacing").
        batch_size = max(args.batch_size, paced_chunk(rate)) if rate > 0 else args.batch_size
        return BenchConfig(
            service_url=broker.service_url,
            message_size=args.message_size,
            batch_size=batch_size,
            duration=args.duration,
            rate=rate,
            progress=False,
            max_in_flight=8,
            pace_ms=PEER_PACE_MS,
            consumer_process=args.consumer_process,
        )

    with spawned_broker(sync, grpc_server=args.grpc_server) as broker, _loop_runner() as runner:
        at_max = [runner.run(run_bench(config())) for _ in range(args.repeat)]
        half = statistics.median(r.end_to_end_rate for r in at_max) / 2
        at_half = [runner.run(run_bench(config(half))) for _ in range(args.repeat)]
    return [_danube_result(sync, at_max, "max"), _danube_result(sync, at_half, f"rate={half:.0f}")]


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
            res = runner.run(
                peer.run(url, message_size=args.message_size, duration=args.duration, batch=args.batch_size)
            )
            out.append(res)
    with server() as url:  # fresh server: the latency run does not read the first run's backlog
        with _loop_runner() as runner:
            half = res.end_to_end_rate / 2
            out.append(
                runner.run(
                    peer.run(
                        url, message_size=args.message_size, duration=args.duration, rate=half, batch=args.batch_size
                    )
                )
            )
    return out


def run_unary(args) -> list[PeerResult]:
    """Interleaved rounds of the three unary targets (see danube_unary.py); medians per target."""
    import statistics

    from bench.peers import danube_unary, grpc_echo
    from danube.cli._process import spawned_broker

    python, why_not = danube_unary.client_venv_python()
    driver = "danube-client 0.5.0 (its venv)" if python else f"danube's own stubs (client venv unavailable: {why_not})"
    sync = args.unary_sync
    labels = ("grpc.aio echo (raw)", "grpc.aio echo (Danube API)", f"danube SendMessage sync={sync}")
    runs: dict[str, list[dict]] = {label: [] for label in labels}
    with grpc_echo.echo_server() as echo_address, spawned_broker(sync, grpc_server=args.grpc_server) as broker:
        targets = (("raw", echo_address), ("danube", f"http://{echo_address}"), ("danube", broker.service_url))
        for round_no in range(args.unary_rounds):
            for label, (target, address) in zip(labels, targets):
                print(f"  unary round {round_no + 1}/{args.unary_rounds}: {label}", file=sys.stderr, flush=True)
                kwargs = {
                    "message_size": args.message_size,
                    "duration": args.duration,
                    "concurrency": args.unary_concurrency,
                    "topic": f"/default/unary-{round_no}",
                }
                if python:
                    res = danube_unary.drive_with_client(python, target, address, **kwargs)
                else:
                    with _loop_runner() as runner:
                        res = runner.run(danube_unary.drive_in_process(target, address, **kwargs))
                runs[label].append(res)
    out = []
    for label in labels:
        rates = [r["rate"] for r in runs[label]]
        rate = statistics.median(rates)
        lat = [r.get("call_latency_ms") or {} for r in runs[label]]
        p50 = [x["p50"] for x in lat if "p50" in x]
        p99 = [x["p99"] for x in lat if "p99" in x]
        out.append(
            PeerResult(
                label,
                f"unary x{args.unary_concurrency}",
                sent=sum(r["calls"] for r in runs[label]),
                seconds=round(sum(r["seconds"] for r in runs[label]), 3),
                publish_rate=rate,
                end_to_end_rate=rate,
                ack_latency_ms={"p50": round(statistics.median(p50), 1), "p99": round(statistics.median(p99), 1)}
                if p50
                else {},
                note=f"unary, driver: {driver}; median of rates {rates}",
            )
        )
    return out


def table(results: list[PeerResult]) -> str:
    head = f"{'system':<32} {'mode':<14} {'e2e msg/s':>12} {'publish msg/s':>14} {'p50 ms':>15} {'p99 ms':>9}"
    lines = [head, "-" * len(head)]
    for r in results:
        lat = r.deliver_latency_ms or r.ack_latency_ms or {}
        lines.append(
            f"{r.system:<32} {r.mode:<14} {r.end_to_end_rate:>12,.0f} {r.publish_rate:>14,.0f} "
            f"{lat.get('p50', float('nan')):>15} {lat.get('p99', float('nan')):>9}"
        )
        if r.note:
            lines.append(f"    {r.note}")
    lines.append("(p50/p99: publish->deliver for the batch-lane and peer rows, per-call latency for the unary rows)")
    lines.append(
        f"(every message sampled; each system's producer and consumer in one client process, sends paced "
        f"every {PEER_PACE_MS:g} ms at a rate, unless --consumer-process)"
    )
    lines.append(
        f"(client process: {_allocator.described()}; the danube broker tunes its own, the echo servers "
        f"keep glibc's defaults)"
    )
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
                out.append(
                    f"sync={sync}: {ratio:.1f}x the faster peer ({best.system}); target >= {target}x: "
                    f"{'met' if ratio >= target else 'NOT met'}"
                )
    for sync in ("interval", "always"):
        d = by.get((f"danube batch lane sync={sync}", "half"))
        if d and d.deliver_latency_ms:
            p99 = d.deliver_latency_ms["p99"]
            out.append(
                f"sync={sync} p99 publish->deliver at half max rate: {p99} ms; target <= 10 ms: "
                f"{'met' if p99 <= 10 else 'NOT met'}"
            )
    unary = next((r for r in results if r.system.startswith("danube SendMessage")), None)
    for echo_name in ("grpc.aio echo (Danube API)", "grpc.aio echo (raw)"):
        echo = next((r for r in results if r.system == echo_name), None)
        if echo and unary and echo.publish_rate:
            ratio = unary.publish_rate / echo.publish_rate
            out.append(
                f"{unary.system}: {ratio:.0%} of the {echo_name} rate (medians, same driver and "
                f"concurrency); target >= 80%: {'met' if ratio >= 0.8 else 'NOT met'}"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--message-size", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=1000, help="messages per batch/pipeline/fetch")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--unary-concurrency", type=int, default=64, help="unary calls in flight (default 64)")
    parser.add_argument(
        "--unary-sync",
        choices=["always", "interval"],
        default="always",
        help="sync policy of the broker in the unary comparison (default always)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of every danube configuration; medians are reported"
    )
    parser.add_argument(
        "--grpc-server",
        choices=GRPC_SERVERS + tuple(GRPC_SERVER_ALIASES),
        default=None,
        help="what serves the brokers' client port (default: the broker's default, native)",
    )
    parser.add_argument(
        "--unary-rounds",
        type=int,
        default=5,
        help="interleaved rounds of the three unary targets (default 5: one round's rates "
        "spread by about 15%%); medians are reported",
    )
    parser.add_argument(
        "--consumer-process",
        action="store_true",
        help="run danube's consumer in a child process (danube bench's default) instead of in the "
        "producer's process as the peers do",
    )
    parser.add_argument(
        "--only", action="append", choices=["danube", "nats", "redis", "unary"], help="run only these (repeatable)"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.unary_rounds < 1:
        parser.error("--repeat and --unary-rounds must be at least 1")
    _allocator.tune()  # this one client process drives every system, so they all get it
    only = set(args.only or ["danube", "nats", "redis", "unary"])
    results: list[PeerResult] = []
    skipped = []
    machine_states: dict[str, dict] = {}
    if "danube" in only:
        for sync in ("interval", "always"):
            print(f"running danube batch lane sync={sync} ...", file=sys.stderr, flush=True)
            with observe() as machine_states[f"danube sync={sync}"]:
                results += run_danube(sync, args)
    for name, binary in (("nats", "nats-server"), ("redis", "redis-server")):
        if name not in only:
            continue
        if shutil.which(binary) is None:
            skipped.append(f"{name}: {binary} not installed (bash bench/peers/setup.sh)")
            continue
        print(f"running {name} ...", file=sys.stderr, flush=True)
        with observe() as machine_states[name]:
            results += run_peer(name, args)
    if "unary" in only:
        print("running unary echo baseline and danube unary ...", file=sys.stderr, flush=True)
        with observe() as machine_states["unary"]:
            results += run_unary(args)
    print(table(results))
    for section, state in machine_states.items():
        print(f"{section}: {describe(state)}")
    for line in verdicts(results) + [f"skipped {s}" for s in skipped]:
        print(line)
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, f"peers-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(
            {
                "args": vars(args),
                "cpu_count": os.cpu_count(),
                "results": [asdict(r) for r in results],
                "verdicts": verdicts(results),
                "skipped": skipped,
                "machine": machine_states,
            },
            f,
            indent=2,
        )
    print(f"JSON: {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
