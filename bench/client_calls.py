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


async def _count_drive(args: argparse.Namespace) -> dict:
    """One-message sends and their delivery and ack, counted: ``--topics`` producers and as many
    consumers (each side on its own ``--connections`` clients, as danube bench's two processes
    have), ``--count-rounds`` rounds in which every producer sends one message (``send_batch`` of
    one, as danube bench's paced calls at 10 msg/s per topic) and the round waits until every
    message is acked by the broker and delivered and acked by its consumer.  Python function calls
    (``sys.setprofile`` 'call' events) and C calls ('c_call') over every round but the first,
    divided by the messages; the first round is the warm-up."""
    import cProfile
    import pstats

    from danube.client import DanubeClient
    from danube.client.consumer_set import ConsumerSet

    conns = max(1, args.connections)
    pclients = [DanubeClient.builder().service_url(args.url).build() for _ in range(conns)]
    cclients = [DanubeClient.builder().service_url(args.url).build() for _ in range(conns)]
    run = f"{os.getpid()}-{int(time.time() * 1000)}"
    topics = [f"/default/count-{run}-{i}" for i in range(args.topics)]
    producers = [
        pclients[i % conns].new_producer().with_topic(t).with_name(f"count-p{i}").build() for i, t in enumerate(topics)
    ]
    consumers = [
        cclients[i % conns]
        .new_consumer()
        .with_topic(t)
        .with_consumer_name(f"count-c{i}")
        .with_subscription("count")
        .with_subscription_type("Exclusive")
        .build()
        for i, t in enumerate(topics)
    ]
    await asyncio.gather(*(p.create() for p in producers))
    await asyncio.gather(*(c.subscribe() for c in consumers))
    payload = b"\x00" * args.message_size
    state = {"delivered": 0, "acked": 0}
    round_done = asyncio.Event()
    want = {"n": 0}

    def check() -> None:
        if state["delivered"] >= want["n"] and state["acked"] >= want["n"]:
            round_done.set()

    def on_ack(fut) -> None:
        if fut.exception() is None:
            state["acked"] += 1
        check()

    async def consume() -> None:
        group = ConsumerSet(consumers)
        try:
            while True:
                ready = await group.receive()
                for consumer, batches in ready:
                    for batch in batches:
                        state["delivered"] += batch.count
                        await consumer.ack_batch(batch)
                check()
        finally:
            group.close()

    consumer_task = asyncio.ensure_future(consume())
    counts = {"call": 0, "c_call": 0}

    def prof(frame, event, arg) -> None:
        if event in counts:
            counts[event] += 1

    profiler = cProfile.Profile() if args.cprofile else None
    for r in range(1 if args.callgrind else args.count_rounds):  # under callgrind: the unobserved pass only
        if r == 1:
            if profiler is not None:
                profiler.enable()
            else:
                sys.setprofile(prof)
        want["n"] += len(producers)
        round_done.clear()
        for p in producers:
            (await p.send_batch([payload])).add_done_callback(on_ack)
        await asyncio.wait_for(round_done.wait(), 30)
        await asyncio.sleep(args.gap_ms / 1000)
    sys.setprofile(None)
    messages = (args.count_rounds - 1) * len(producers)
    # then the same rounds again unobserved: this process's CPU (every thread) per message
    cpu = 0.0
    for _ in range(args.count_rounds - 1):
        want["n"] += len(producers)
        round_done.clear()
        cpu0 = _cpu()
        for p in producers:
            (await p.send_batch([payload])).add_done_callback(on_ack)
        await asyncio.wait_for(round_done.wait(), 30)
        cpu += _cpu() - cpu0
        await asyncio.sleep(args.gap_ms / 1000)
    out = {"messages": messages, "delivered": state["delivered"], "acked": state["acked"]}
    out["cpu_us_per_msg"] = round(cpu * 1e6 / messages, 1)
    if profiler is not None:
        profiler.disable()
        stats = pstats.Stats(profiler)
        out["calls_per_msg"] = round(stats.total_calls / messages, 2)
        # the functions with the most own time: [name, calls per message, own us per message]
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[: args.cprofile]
        out["top"] = [
            [f"{os.path.basename(k[0])}:{k[1]}:{k[2]}", round(v[1] / messages, 2), round(v[2] * 1e6 / messages, 2)]
            for k, v in rows
        ]
    else:
        out["py_calls_per_msg"] = round(counts["call"] / messages, 2)
        out["c_calls_per_msg"] = round(counts["c_call"] / messages, 2)
    consumer_task.cancel()
    for c in consumers:
        await c.close()
    for p in producers:
        await p.close()
    for c in pclients + cclients:
        await c.close()
    return out


def _child(args: argparse.Namespace) -> None:
    import gc

    gc.collect()
    gc.freeze()  # as danube bench does: collections stay short during the run
    if args.count:  # on uvloop, as danube bench runs: the loop's own Python calls are not counted
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            print(json.dumps(runner.run(_count_drive(args))))
        return
    print(json.dumps(asyncio.run(_drive(args))))


def _callgrind_tree(cmd: list[str], env: dict, args: argparse.Namespace) -> dict:
    """The client's instructions per message (the event loop's thread and every other one): the
    child under callgrind with ``--count-rounds`` rounds and with 20 more, the difference divided
    by the messages of those 20 rounds, so setup and teardown cancel out."""
    import tempfile

    totals = []
    for extra in (0, 20):
        rounds = args.count_rounds + extra
        with tempfile.NamedTemporaryFile(prefix="client-calls-", suffix=".cg") as out:
            run = list(cmd) + ["--callgrind"]
            run[run.index("--count-rounds") + 1] = str(rounds)
            proc = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}"] + run,
                env=env,
                capture_output=True,
                text=True,
                timeout=1800,
            )
            lines = [ln for ln in open(out.name) if ln.startswith(("summary:", "totals:"))]
            if proc.returncode != 0 or not lines:
                return {"errors": [f"callgrind run failed: {proc.stderr[-800:]}"]}
            totals.append(int(lines[-1].split()[1]))
    return {"instr_per_msg": round((totals[1] - totals[0]) / (20 * args.topics))}


def _run_tree(tree: str, url: str, args: argparse.Namespace, profile: str | None = None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--url", url]
    for name in ("topics", "rate", "per_call", "pace_ms", "duration", "connections", "message_size", "in_flight"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.count:
        cmd += ["--count", "--count-rounds", str(args.count_rounds), "--gap-ms", str(args.gap_ms)]
        cmd += ["--cprofile", str(args.cprofile)] if args.cprofile else []
    env = {**os.environ, "PYTHONPATH": tree}
    if args.callgrind:
        return _callgrind_tree(cmd, env, args)
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
    ap.add_argument("--count", action="store_true", help="Python calls per one-message send + delivery + ack")
    ap.add_argument("--count-rounds", type=int, default=21, help="with --count: rounds of one message per producer")
    ap.add_argument("--gap-ms", type=float, default=5.0, help="with --count: pause between rounds")
    ap.add_argument(
        "--callgrind", action="store_true", help="with --count: instructions per message (valgrind callgrind)"
    )
    ap.add_argument("--cprofile", type=int, default=0, help="with --count: cProfile, this many top functions")
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
    if args.count:
        for name, runs in results.items():
            print(
                f"{name}: "
                + json.dumps(
                    {
                        k: [x.get(k) for x in runs]
                        for k in (
                            "py_calls_per_msg",
                            "c_calls_per_msg",
                            "calls_per_msg",
                            "cpu_us_per_msg",
                            "instr_per_msg",
                        )
                        if any(k in x for x in runs)
                    }
                )
            )
        return
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
