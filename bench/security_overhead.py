"""What TLS + JWT costs: batch-lane throughput and unary calls/s, secured vs plain text, one run.

    python -m bench.security_overhead [--rounds 3] [--duration 3] [--sync interval] [--json]

Two brokers run side by side (subprocesses on free loopback ports, stopped by PID): one plain,
one with TLS on both ports and JWT + RBAC (``--tls-cert/--tls-key --jwt-secret-file``, the
token's subject a super admin, so the guard still verifies the token and runs the RBAC check on
every call).  Certificates and the secret are made for the run.  Rounds interleave plain and
secured so both see the same machine:

- **batch lane**: ``danube.client`` producer, 100-byte messages in ``send_batch`` calls of 1000,
  8 batches in flight, acked (durable) messages per second;
- **unary**: the real ``danube-client`` 0.5.0 (its venv), 64 ``SendMessage`` calls in flight,
  with ``.with_tls(ca).with_token(jwt)`` on the secured broker (falls back to this repo's
  stubs with the same metadata when the venv cannot be made, and says so).

Targets (docs/security.md): secured batch lane >= 80% of plain, secured unary >= 60% of plain (medians).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

SECRET = "bench-secret-0123456789abcdef-0123456789"
DRIVER = os.path.join(REPO, "bench", "security_unary_driver.py")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_broker(data_dir: str, extra: list[str], sync: str):
    from tests.support.broker import BrokerProcess
    from tests.support.ports import free_port

    broker = BrokerProcess(
        data_dir=data_dir,
        port=free_port(),
        admin_port=free_port(),
        metrics_port=0,
        log_path=os.path.join(data_dir, "broker.log"),
        extra_args=["--sync", sync, "--load-report-interval", "0", *extra],
    )
    broker.metrics_port = 0
    broker.start()
    return broker


async def batch_lane(url: str, security: dict | None, *, duration: float, topic: str) -> dict:
    from danube.client import DanubeClient

    builder = DanubeClient.builder().service_url(url).with_health_check_interval(0)
    if security:
        builder = builder.with_tls(security["ca"]).with_token(security["token"])
    client = builder.build()
    producer = client.new_producer().with_topic(topic).with_name("bench").with_reliable().with_max_in_flight(8).build()
    await producer.create()
    batch = [b"\x00" * 100] * 1000
    pending: list = []
    acked = 0
    try:
        warm_end = time.perf_counter() + 0.5
        while time.perf_counter() < warm_end:
            pending.append(await producer.send_batch(batch))
        await asyncio.gather(*pending)
        pending.clear()
        start = time.perf_counter()
        deadline = start + duration
        while time.perf_counter() < deadline:
            pending.append(await producer.send_batch(batch))
            if len(pending) >= 32:
                await pending.pop(0)
                acked += len(batch)
        for future in pending:
            await future
            acked += len(batch)
        seconds = time.perf_counter() - start
    finally:
        await producer.close()
        await client.close()
    return {"messages": acked, "seconds": round(seconds, 3), "rate": round(acked / seconds, 1)}


def unary(python: str | None, url: str, security: dict | None, *, duration: float, topic: str) -> dict:
    if python is None:
        return asyncio.run(unary_in_process(url, security, duration=duration, topic=topic))
    from tests.support.danube_client_venv import script_env

    cmd = [python, DRIVER, url, "--duration", str(duration), "--topic", topic]
    if security:
        cmd += ["--ca", security["ca"], "--token", security["token"]]
    proc = subprocess.run(cmd, env=script_env(), capture_output=True, text=True, timeout=duration + 120)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"unary driver failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


async def unary_in_process(url: str, security: dict | None, *, duration: float, topic: str) -> dict:
    import grpc

    from danube.client.connection import address_of
    from danube.proto.danube import DanubeApi_pb2 as pb
    from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc

    metadata = None
    if security:
        with open(security["ca"], "rb") as f:
            channel = grpc.aio.secure_channel(address_of(url), grpc.ssl_channel_credentials(f.read()))
        metadata = (("authorization", f"Bearer {security['token']}"),)
    else:
        channel = grpc.aio.insecure_channel(address_of(url))
    stub = pb_grpc.ProducerServiceStub(channel)
    answer = await stub.CreateProducer(
        pb.ProducerRequest(request_id=1, producer_name="bench", topic_name=topic, dispatch_strategy=pb.Reliable),
        metadata=metadata,
    )
    counted = [0]
    deadline = time.perf_counter() + 0.5 + duration
    measure_from = deadline - duration

    async def worker():
        while True:
            t0 = time.perf_counter()
            if t0 >= deadline:
                return
            await stub.SendMessage(
                pb.StreamMessage(
                    request_id=1,
                    msg_id=pb.MsgID(producer_id=answer.producer_id),
                    payload=b"\x00" * 100,
                    producer_name="bench",
                ),
                metadata=metadata,
            )
            if t0 >= measure_from:
                counted[0] += 1

    await asyncio.gather(*(worker() for _ in range(64)))
    await channel.close()
    return {"calls": counted[0], "seconds": duration, "rate": round(counted[0] / duration, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--sync", choices=["always", "interval", "never"], default="interval")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from danube.security.jwt import issue_token
    from tests.support.certs import make_pki

    try:
        from tests.support.danube_client_venv import ensure_venv

        python, driver = ensure_venv(), "danube-client 0.5.0 (its venv)"
    except Exception as exc:  # noqa: BLE001
        python, driver = None, f"this repo's stubs (client venv unavailable: {type(exc).__name__})"

    with tempfile.TemporaryDirectory(prefix="danube-secbench-") as tmp:
        pki = make_pki(os.path.join(tmp, "pki"))
        secret_file = os.path.join(tmp, "secret")
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, SECRET.encode())
        os.close(fd)
        security = {"ca": pki.ca, "token": issue_token("bench", SECRET, expires_in_s=3600)}
        brokers = {}
        try:
            os.makedirs(os.path.join(tmp, "plain"))
            os.makedirs(os.path.join(tmp, "secure"))
            brokers["plain"] = start_broker(os.path.join(tmp, "plain"), [], args.sync)
            brokers["secure"] = start_broker(
                os.path.join(tmp, "secure"),
                [
                    "--tls-cert",
                    pki.server.cert,
                    "--tls-key",
                    pki.server.key,
                    "--jwt-secret-file",
                    secret_file,
                    "--super-admin",
                    "bench",
                ],
                args.sync,
            )
            rates: dict = {(kind, mode): [] for kind in ("batch", "unary") for mode in ("plain", "secure")}
            cpu_per_call: dict = {"plain": [], "secure": []}
            for round_no in range(args.rounds):
                for mode in ("plain", "secure"):
                    broker = brokers[mode]
                    sec = security if mode == "secure" else None
                    print(f"round {round_no + 1}/{args.rounds}: {mode} batch lane", file=sys.stderr, flush=True)
                    res = asyncio.run(
                        batch_lane(broker.url, sec, duration=args.duration, topic=f"/default/batch-{round_no}")
                    )
                    rates[("batch", mode)].append(res["rate"])
                    print(f"round {round_no + 1}/{args.rounds}: {mode} unary", file=sys.stderr, flush=True)
                    cpu_before = cpu_seconds(broker.proc.pid)
                    res = unary(python, broker.url, sec, duration=args.duration, topic=f"/default/unary-{round_no}")
                    cpu_used = cpu_seconds(broker.proc.pid) - cpu_before
                    rates[("unary", mode)].append(res["rate"])
                    # Calls made in the whole driver run (warm-up included) ~ rate x (duration + warm-up).
                    calls = max(res["rate"] * (args.duration + 0.5), 1.0)
                    cpu_per_call[mode].append(cpu_used / calls * 1e6)
        finally:
            for broker in brokers.values():
                broker.stop()

    med = {key: statistics.median(values) for key, values in rates.items()}
    result = {
        "command": "python -m bench.security_overhead " + " ".join(argv if argv is not None else sys.argv[1:]),
        "sync": args.sync,
        "rounds": args.rounds,
        "duration_s": args.duration,
        "unary_driver": driver,
        "batch_lane_msg_s": {
            "plain": med[("batch", "plain")],
            "tls_jwt": med[("batch", "secure")],
            "rounds_plain": rates[("batch", "plain")],
            "rounds_tls_jwt": rates[("batch", "secure")],
        },
        "unary_calls_s": {
            "plain": med[("unary", "plain")],
            "tls_jwt": med[("unary", "secure")],
            "rounds_plain": rates[("unary", "plain")],
            "rounds_tls_jwt": rates[("unary", "secure")],
        },
    }
    result["unary_broker_cpu_us_per_call"] = {
        "plain": round(statistics.median(cpu_per_call["plain"]), 1),
        "tls_jwt": round(statistics.median(cpu_per_call["secure"]), 1),
        "note": "broker process CPU over the whole driver run (connection set-up included) / calls",
    }
    result["batch_lane_ratio"] = round(med[("batch", "secure")] / med[("batch", "plain")], 3)
    result["unary_ratio"] = round(med[("unary", "secure")] / med[("unary", "plain")], 3)
    result["targets_met"] = {
        "batch_lane>=0.80": result["batch_lane_ratio"] >= 0.80,
        "unary>=0.60": result["unary_ratio"] >= 0.60,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"batch lane (acked msg/s, median of {args.rounds}): plain {med[('batch', 'plain')]:,.0f}, "
            f"TLS+JWT {med[('batch', 'secure')]:,.0f} -> {result['batch_lane_ratio']:.0%} (target >= 80%)"
        )
        print(
            f"unary SendMessage x64 ({driver}): plain {med[('unary', 'plain')]:,.0f} calls/s, "
            f"TLS+JWT {med[('unary', 'secure')]:,.0f} -> {result['unary_ratio']:.0%} (target >= 60%)"
        )
        cpu = result["unary_broker_cpu_us_per_call"]
        print(f"broker CPU per unary call: plain {cpu['plain']:.0f} us, TLS+JWT {cpu['tls_jwt']:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
