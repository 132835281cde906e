"""The producer client's CPU per publish call: many topics, small paced ``send_batch`` calls.

    python bench/client_calls.py --base /work/main/src [--broker-src /work/main/src]
        [--topics 100] [--rate 5000] [--per-call 2] [--pace-ms 10] [--duration 5]
        [--connections 8] [--rounds 2]

One broker (from ``--broker-src``, the same for every run) on free loopback ports.  Each run is
a child process whose ``PYTHONPATH`` is a client tree (this tree's ``src`` or ``--base``): it
opens ``--connections`` clients and one producer per topic, and every producer makes one
``send_batch`` call of ``--per-call`` messages every ``--pace-ms`` (the shape of ``danube bench
--topics N --rate R --pace-ms P``, without consumers), then flushes.  The child reports its own
CPU (user + system, all threads, ``getrusage``) over the producing phase divided by its calls,
the calls it made per second and the publish->ack p99.  The trees alternate which goes first in
every round, so each ratio compares runs made seconds apart on one broker.  Keep ``--rate``
below what the machine can carry to compare costs rather than saturation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def _drive(args: argparse.Namespace) -> dict:
    from danube.client import DanubeClient

    clients = [DanubeClient.builder().service_url(args.url).build() for _ in range(args.connections)]
    run = f"{os.getpid()}-{int(time.time() * 1000)}"
    producers = []
    for i in range(args.topics):
        producer = (
            clients[i % len(clients)]
            .new_producer()
            .with_topic(f"/default/calls-{run}-{i}")
            .with_name(f"calls-p{i}")
            .with_max_in_flight(args.in_flight)
            .build()
        )
        producers.append(producer)
    await asyncio.gather(*(p.create() for p in producers))
    payload = b"\x00" * args.message_size
    batch = [payload] * args.per_call
    per_producer_calls = args.rate / args.per_call / args.topics
    ack_lat: list[float] = []
    errors: list[str] = []
    perf = time.perf_counter

    async def produce(producer, deadline: float) -> int:
        started, calls = perf(), 0
        while perf() < deadline:
            t0 = perf()
            fut = await producer.send_batch(batch)
            calls += 1

            def done(f, t0=t0):
                if f.cancelled() or f.exception() is not None:
                    errors.append("cancelled" if f.cancelled() else str(f.exception()))
                else:
                    ack_lat.append(perf() - t0)

            fut.add_done_callback(done)
            delay = started + calls / per_producer_calls - perf()
            if delay > 0:
                await asyncio.sleep(delay)
        await producer.flush()
        return calls

    cpu0, t0 = _cpu(), perf()
    calls = sum(await asyncio.gather(*(produce(p, t0 + args.duration) for p in producers)))
    cpu, wall = _cpu() - cpu0, perf() - t0
    for p in producers:
        await p.close()
    for c in clients:
        await c.close()
    ack_lat.sort()
    return {
        "calls": calls,
        "calls_per_s": round(calls / wall, 1),
        "cpu_s": round(cpu, 3),
        "cpu_us_per_call": round(cpu * 1e6 / max(1, calls), 1),
        "ack_p50_ms": round(ack_lat[int(0.5 * (len(ack_lat) - 1))] * 1000, 2) if ack_lat else None,
        "ack_p99_ms": round(ack_lat[int(0.99 * (len(ack_lat) - 1))] * 1000, 2) if ack_lat else None,
        "acked_calls": len(ack_lat),
        "errors": errors[:3],
    }


def _child(args: argparse.Namespace) -> None:
    import gc

    gc.collect()
    gc.freeze()  # as danube bench does: collections stay short during the run
    print(json.dumps(asyncio.run(_drive(args))))


def _run_tree(tree: str, url: str, args: argparse.Namespace, profile: str | None = None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--url", url]
    for name in ("topics", "rate", "per_call", "pace_ms", "duration", "connections", "message_size", "in_flight"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = {**os.environ, "PYTHONPATH": tree}
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if profile:  # py-spy over the middle of the producing phase (raw stacks, with native frames)
        time.sleep(3 + args.duration / 4)
        seconds = str(max(1, int(args.duration / 2)))
        subprocess.run(
            ["py-spy", "record", "-p", str(child.pid), "-d", seconds, "-r", "200", "-f", "raw", "-o", profile]
            + (["--native"] if args.native else []),
            capture_output=True,
        )
    try:
        stdout, stderr = child.communicate(timeout=args.duration * 10 + 60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {"errors": [f"client failed: {stderr[-800:]}"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--base", default="/work/main/src", help="src dir of the client tree to compare with")
    ap.add_argument("--broker-src", default="/work/main/src", help="src dir the broker runs from")
    ap.add_argument("--sync", default="never")
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--rate", type=float, default=5000, help="messages per second over all producers")
    ap.add_argument("--per-call", type=int, default=2)
    ap.add_argument("--pace-ms", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--message-size", type=int, default=100)
    ap.add_argument(
        "--in-flight", type=int, default=None, help="max_in_flight per producer (default: as danube bench sets it)"
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", default=None, help="py-spy raw output prefix: FILE-this.txt, FILE-base.txt (round 0)")
    ap.add_argument("--native", action="store_true", help="py-spy with native frames")
    args = ap.parse_args()
    if args.in_flight is None:  # danube bench: --max-in-flight 8 times the calls a --batch-size 1000 is cut into
        args.in_flight = 8 * -(-1000 // args.per_call)
    if args.child:
        _child(args)
        return
    sys.path.insert(0, args.broker_src)
    os.environ["PYTHONPATH"] = args.broker_src
    from danube.cli._process import spawned_broker

    trees = {"this": SRC, "base": args.base}
    results: dict[str, list[dict]] = {name: [] for name in trees}
    with spawned_broker(args.sync) as broker:
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for name in order:
                profile = f"{args.profile}-{name}.txt" if args.profile and r == 0 else None
                res = _run_tree(trees[name], broker.service_url, args, profile)
                results[name].append(res)
                print(f"round {r} {name:<5} {json.dumps(res)}", file=sys.stderr)
    summary = {}
    for name, runs in results.items():
        ok = [x for x in runs if "cpu_us_per_call" in x]
        summary[name] = {
            "cpu_us_per_call": round(sum(x["cpu_us_per_call"] for x in ok) / len(ok), 1) if ok else None,
            "calls_per_s": round(sum(x["calls_per_s"] for x in ok) / len(ok), 1) if ok else None,
            "ack_p50_ms": max((x.get("ack_p50_ms") or 0) for x in ok) if ok else None,
            "ack_p99_ms": max((x["ack_p99_ms"] or 0) for x in ok) if ok else None,
        }
    if summary["this"]["cpu_us_per_call"] and summary["base"]["cpu_us_per_call"]:
        summary["this/base"] = round(summary["this"]["cpu_us_per_call"] / summary["base"]["cpu_us_per_call"], 3)
    summary["load"] = os.getloadavg()[0]
    print(json.dumps(summary) if args.json else "\n".join(f"{k}: {v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
