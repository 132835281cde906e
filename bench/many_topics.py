"""Many active topics with small batches: one broker, 1 topic against N topics, per sync mode.

    python bench/many_topics.py [--before /tmp/before/src] [--sync always interval never]
        [--topics 100] [--rate 25000] [--pace-ms 10] [--duration 5] [--connections 8]
        [--shape pair|many|idle] [--client-processes 1 2]

For each sync mode: a broker (``danube broker --sync S`` on free loopback ports, stopped by PID),
then ``danube bench --service-url URL --broker-pid PID`` with 1 topic, and with ``--topics N
--producers N --consumers N --connections C``, each on a fresh broker.  With ``--before`` the
same pair also runs on a broker from that source tree (its core built in place), alternating
which tree goes first, so every ratio compares runs made minutes apart.  The bench client is
always this tree's.  Prints delivered msgs/s, publish->deliver p99, the broker's CPU per message
and per call, its threads, the bench client's CPU per message and per call with its busiest producer
and consumer process (in cores) and what limited the run (``limited_by``: the client, the broker, or
nothing), and the N-topic / 1-topic CPU ratio of each tree.  Delivery is counted: messages offered
by the schedule, sent, delivered and missing; ``delivered_per_s`` runs from the start to the last
delivery, so it is below the offered rate by the tail latency even when nothing is missing.
``--client-processes 1 2`` runs every N-topic shape once per number of bench producer processes.

``--shape many`` runs the other shape instead: ``--topics 1000`` topics at ``--rate`` in total
(10 msgs/s each by default) from as many producers over 50 connections.

``--shape idle``: ``--topics`` topics (200 by default) each get one message, the clients
disconnect, and the broker's CPU over the next ``--duration`` seconds and its threads are
printed: what idle topics cost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
sys.path.insert(0, SRC)

from danube.cli._process import spawned_broker  # noqa: E402


@contextlib.contextmanager
def _pythonpath(path: str):
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def run_one(tree: str, sync: str, bench_args: list[str], timeout: float) -> dict:
    with _pythonpath(tree), spawned_broker(sync) as broker:
        cmd = [
            sys.executable,
            "-m",
            "danube.cli.main",
            "bench",
            "--service-url",
            broker.service_url,
            "--broker-pid",
            str(broker.proc.pid),
            "--json",
            "--no-progress",
            *bench_args,
        ]
        try:
            out = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": SRC}
            )
        except subprocess.TimeoutExpired:
            return {"errors": [f"bench did not finish within {timeout:.0f} s"]}
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:
        return {"errors": [f"bench failed: {out.stderr[-500:]}"]}


async def _touch_topics(url: str, n: int) -> None:
    from danube.client import DanubeClient

    client = DanubeClient.builder().service_url(url).build()
    try:
        base = f"/default/idle-{os.getpid()}"
        for i in range(n):
            producer = client.new_producer().with_topic(f"{base}-{i}").with_name(f"idle-{i}").build()
            await producer.create()
            await producer.send(b"x")
            await producer.close()
    finally:
        await client.close()


def run_idle(tree: str, sync: str, topics: int, seconds: float) -> dict:
    import asyncio
    import time

    from danube.processes import cpu_seconds, thread_count

    with _pythonpath(tree), spawned_broker(sync) as broker:
        asyncio.run(_touch_topics(broker.service_url, topics))
        time.sleep(1.0)  # the last closes settle
        c0 = cpu_seconds(broker.proc.pid)
        time.sleep(seconds)
        cpu = cpu_seconds(broker.proc.pid) - c0
        return {"idle_cpu_pct": round(cpu / seconds * 100, 1), "threads": thread_count(broker.proc.pid)}


def summary(r: dict, offered: float) -> dict:
    lat = r.get("deliver_latency_ms") or {}
    sent, delivered = r.get("sent") or 0, r.get("delivered") or 0
    offered_n = r.get("offered") or 0
    return {
        # counted: messages the schedule offered, made, and delivered within the drain timeout
        "offered": offered_n,
        "sent": sent,
        "delivered": delivered,
        "missing": r.get("missing", max(0, sent - delivered)),
        "delivered_of_offered": round(delivered / offered_n, 4) if offered_n else None,
        "delivered_per_s": r.get("end_to_end_rate"),  # start to last delivery: short by the tail latency
        "pacer_lag_ms": r.get("pacer_lag_ms"),
        "p99_ms": lat.get("p99"),
        "cpu_us_msg": r.get("broker_cpu_us_per_msg"),
        "cpu_us_call": r.get("broker_cpu_us_per_call"),
        "calls_s": r.get("calls_per_s"),
        "threads": r.get("broker_threads"),
        "broker_cores": r.get("broker_cores"),
        "sent_per_s_of_offered": round((r.get("sent_rate") or 0) / offered, 3),
        "client_procs": r.get("client_processes"),
        "client_us_msg": r.get("client_cpu_us_per_msg"),
        "client_us_call": r.get("client_cpu_us_per_call"),
        "client_cores": r.get("client_cores"),
        "producer_core": r.get("producer_core_max"),
        "consumer_core": r.get("consumer_core_max"),
        "machine_busy_pct": r.get("machine_busy_pct"),
        "limited_by": r.get("limited_by"),
        "setup_s": r.get("setup_s"),
        "errors": (r.get("errors") or [])[:2],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=None, help="src dir of the tree to compare with")
    ap.add_argument("--sync", nargs="+", default=["always", "interval", "never"])
    ap.add_argument("--shape", choices=["pair", "many", "idle"], default="pair")
    ap.add_argument("--topics", type=int, default=None)
    ap.add_argument("--rate", type=float, default=None)
    ap.add_argument("--pace-ms", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=None)
    ap.add_argument(
        "--client-processes",
        type=int,
        nargs="+",
        default=[1],
        help="run each shape with each of these `danube bench --client-processes` (the 1-topic shape always with 1)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    trees = [("after", SRC)] + ([("before", os.path.abspath(args.before))] if args.before else [])
    common = ["--duration", str(args.duration), "--pace-ms", str(args.pace_ms)]
    if args.shape == "idle":
        for i, sync in enumerate(args.sync):
            for name, tree in trees if i % 2 == 0 else list(reversed(trees)):
                row = {
                    "tree": name,
                    "sync": sync,
                    "topics": args.topics or 200,
                    **run_idle(tree, sync, args.topics or 200, args.duration),
                }
                print(json.dumps(row), flush=True)
        return
    if args.shape == "pair":
        n = args.topics or 100
        rate = args.rate or 25000
        shapes = [
            ("1 topic", ["--rate", str(rate)]),
            (
                f"{n} topics",
                [
                    "--rate",
                    str(rate),
                    "--topics",
                    str(n),
                    "--producers",
                    str(n),
                    "--consumers",
                    str(n),
                    "--connections",
                    str(args.connections or 8),
                ],
            ),
        ]
    else:
        n = args.topics or 1000
        rate = args.rate or 10.0 * n
        shapes = [
            (
                f"{n} topics",
                [
                    "--rate",
                    str(rate),
                    "--topics",
                    str(n),
                    "--producers",
                    str(n),
                    "--consumers",
                    str(n),
                    "--connections",
                    str(args.connections or 50),
                ],
            )
        ]
    rows = []
    for i, sync in enumerate(args.sync):
        order = trees if i % 2 == 0 else list(reversed(trees))
        for name, tree in order:
            for label, extra in shapes:
                for procs in args.client_processes if label != "1 topic" else [1]:
                    # setting up a thousand producers and consumers takes minutes on a busy 2-core VM
                    r = run_one(
                        tree,
                        sync,
                        common + extra + ["--client-processes", str(procs)],
                        timeout=args.duration + 150 + 1.0 * n,
                    )
                    row = {"tree": name, "sync": sync, "shape": label, **summary(r, rate)}
                    rows.append(row)
                    if not args.json:
                        print(json.dumps(row), flush=True)
    if args.shape == "pair":
        for sync in args.sync:
            for name, _ in trees:
                got = {
                    r["shape"]: r
                    for r in rows
                    if r["sync"] == sync and r["tree"] == name and r["client_procs"] in (1, None)
                }
                one, many = got.get("1 topic"), got.get(f"{n} topics")
                if one and many and one["cpu_us_msg"] and many["cpu_us_msg"]:
                    print(
                        f"{sync:<9} {name:<7} CPU/msg {n} topics / 1 topic = "
                        f"{many['cpu_us_msg'] / one['cpu_us_msg']:.2f}"
                    )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
