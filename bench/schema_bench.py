"""Batch-lane throughput with a topic's schema policy on, against off, in the same run.

    python bench/schema_bench.py [--seconds 3] [--rounds 3] [--json]

One broker (`danube broker`, sync=interval) and one danube.client producer in this process.
An Avro subject (records of ~100 B) is registered; three topics differ only in their schema
config: ``off`` (none), ``ids`` (enforce, schema id/version checked once per batch) and
``validate`` (enforce + payload validation: every payload checked by the compiled Avro
checker); ``plain`` is the same topic setup as ``off`` written by a producer without a schema
(frames without the schema attributes), for the cost of carrying them.  The same
producer code (``with_schema_subject``, ``send_batch`` of 1,000 records, 8 batches in flight)
publishes for ``--seconds`` per round to each topic in turn, rounds interleaved; each figure is
the median over rounds of acked messages per second, and the broker's CPU time per message
(from /proc) is reported beside it.  Targets: validate ≥ 50% and ids ≥ 95% of off.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import time

from fastavro import parse_schema, schemaless_writer

SCHEMA = {
    "type": "record",
    "name": "Event",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "email", "type": "string"},
        {"name": "score", "type": "double"},
        {"name": "active", "type": "boolean"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}


def payloads(n: int = 1000) -> list[bytes]:
    parsed = parse_schema(SCHEMA)
    out = []
    for i in range(n):
        b = io.BytesIO()
        schemaless_writer(
            b,
            parsed,
            {
                "id": 1_000_000 + i,
                "user": f"user-{i:06d}-abcdefgh-ijklmnop",
                "email": f"user{i:06d}.name@example-mail.com",
                "score": i * 0.5,
                "active": i % 2 == 0,
                "tags": ["alpha", f"t{i % 97:03d}", "gamma-delta"],
            },
        )
        out.append(b.getvalue())
    return out


async def one_round(client, topic: str, batch: list[bytes], seconds: float, schema: bool = True) -> int:
    builder = (
        client.new_producer()
        .with_topic(topic)
        .with_name(f"bench-{os.getpid()}")
        .with_linger_ms(1.0)
        .with_max_in_flight(8)
    )
    if schema:
        builder = builder.with_schema_subject("bench-events")
    producer = builder.build()
    await producer.create()
    try:
        sent = 0
        futures = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            futures.append(await producer.send_batch(batch))
            sent += len(batch)
            if len(futures) > 32:
                await futures.pop(0)
        await producer.flush()
        await asyncio.gather(*futures)
        return sent
    finally:
        await producer.close()


async def main(args) -> dict:
    from danube.cli._process import cpu_seconds, spawned_broker
    from danube.client import DanubeClient
    from danube.client.schema import SchemaRegistryClient

    batch = payloads()
    sizes = [len(p) for p in batch]
    with spawned_broker("interval") as broker:
        client = DanubeClient.builder().service_url(broker.service_url).build()
        try:
            reg = SchemaRegistryClient(client)
            await reg.register("bench-events", "avro", json.dumps(SCHEMA))
            topics = {
                "plain": "/default/schema-plain",
                "off": "/default/schema-off",
                "ids": "/default/schema-ids",
                "validate": "/default/schema-validate",
            }
            await reg.configure_topic(topics["ids"], "bench-events", "enforce", False)
            await reg.configure_topic(topics["validate"], "bench-events", "enforce", True)
            for name, topic in topics.items():  # warm up: create topics, load the validator
                await one_round(client, topic, batch, 0.3, schema=name != "plain")
            rates: dict[str, list[float]] = {k: [] for k in topics}
            cpu: dict[str, list[float]] = {k: [] for k in topics}
            for r in range(args.rounds):
                order = list(topics) if r % 2 == 0 else list(reversed(topics))
                for name in order:
                    c0, t0 = cpu_seconds(broker.proc.pid), time.perf_counter()
                    n = await one_round(client, topics[name], batch, args.seconds, schema=name != "plain")
                    elapsed = time.perf_counter() - t0
                    c1 = cpu_seconds(broker.proc.pid)
                    rates[name].append(n / elapsed)
                    cpu[name].append((c1 - c0) / n * 1e6)
                    print(
                        f"round {r + 1} {name:8s} {n / elapsed:>12,.0f} msg/s   broker {cpu[name][-1]:.2f} µs CPU/msg",
                        file=sys.stderr,
                    )
        finally:
            await client.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    return {
        "payload_bytes": {"min": min(sizes), "mean": sum(sizes) / len(sizes), "max": max(sizes)},
        "rounds": args.rounds,
        "seconds": args.seconds,
        "rates": rates,
        "broker_cpu_us_per_msg": cpu,
        "median_rate": med,
        "median_broker_cpu_us_per_msg": med_cpu,
        "ids_vs_off": med["ids"] / med["off"],
        "validate_vs_off": med["validate"] / med["off"],
        "off_vs_plain": med["off"] / med["plain"],
        "loadavg": os.getloadavg(),
    }


def micro() -> dict:
    """Per-message cost of each validator on ~100 B payloads (µs), in this process."""
    import timeit

    from danube import message_codec
    from danube._pure import avrocheck as pure_check
    from danube.schema.types import parse
    from danube.schema.validation import avro_program, payload_validator

    try:
        from danube._core import avrocheck as core_check
    except ImportError:
        core_check = None
    batch = payloads()
    n = len(batch)
    buf = bytearray(message_codec.encode_payloads(batch, attributes={"danube.schema": "1:1"}))
    avro = parse("avro", json.dumps(SCHEMA))
    prog = avro_program(avro)
    from fastavro import schemaless_reader

    def fastavro_all():
        for p in batch:
            bio = io.BytesIO(p)
            schemaless_reader(bio, avro.parsed, None)

    def best(fn, number):
        return min(timeit.repeat(fn, number=number, repeat=5)) / number / n * 1e6

    out = {
        "avro_fastavro_schemaless_reader": best(fastavro_all, 3),
        "avro_pure_twin_check_frames": best(lambda: pure_check.check_frames(prog, buf), 1),
    }
    if core_check is not None:
        out["avro_compiled_check_frames"] = best(lambda: core_check.check_frames(prog, buf), 50)
    js = parse(
        "json_schema",
        json.dumps(
            {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "user": {"type": "string"},
                    "email": {"type": "string"},
                    "score": {"type": "number"},
                    "active": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["id", "user"],
            }
        ),
    )
    docs = [
        json.dumps(
            {
                "id": i,
                "user": f"user-{i:06d}",
                "email": f"u{i}@example.com",
                "score": 1.5,
                "active": True,
                "tags": ["a", "b"],
            }
        ).encode()
        for i in range(n)
    ]
    check_json = payload_validator(js)  # jsonschema-rs when installed
    out[f"json_schema_{check_json.__name__}"] = best(lambda: [check_json(d) for d in docs], 3)
    import jsonschema

    pure_json = jsonschema.Draft202012Validator(js.parsed)
    out["json_schema_jsonschema_python"] = best(
        lambda: [next(iter(pure_json.iter_errors(json.loads(d))), None) for d in docs], 3
    )
    proto = parse(
        "protobuf",
        'syntax = "proto3"; message Event { int64 id = 1; string user = 2; '
        "string email = 3; double score = 4; bool active = 5; repeated string tags = 6; }",
    )
    from google.protobuf import message_factory

    from danube.schema.types import protobuf_main_message

    cls = message_factory.GetMessageClass(protobuf_main_message(proto))
    msgs = [
        cls(
            id=i,
            user=f"user-{i:06d}-abcdefgh",
            email=f"user{i}@example.com",
            score=0.5,
            active=True,
            tags=["alpha", "beta"],
        ).SerializeToString()
        for i in range(n)
    ]
    check_proto = payload_validator(proto)
    out["protobuf_upb_parse"] = best(lambda: [check_proto(m) for m in msgs], 3)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--micro", action="store_true", help="only the per-message cost of each validator (µs)")
    a = p.parse_args()
    if a.micro:
        for k, v in micro().items():
            print(f"  {k:36s} {v:7.3f} µs/msg")
        sys.exit(0)
    result = asyncio.run(main(a))
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        pb = result["payload_bytes"]
        print(f"Avro records {pb['min']}-{pb['max']} B (mean {pb['mean']:.0f}), {a.rounds} rounds x {a.seconds}s")
        for k in ("plain", "off", "ids", "validate"):
            print(
                f"  {k:8s} {result['median_rate'][k]:>12,.0f} msg/s  broker {result['median_broker_cpu_us_per_msg'][k]:.2f} µs/msg"
            )
        print(f"  ids      {result['ids_vs_off']:.1%} of off (target ≥ 95%)")
        print(f"  validate {result['validate_vs_off']:.1%} of off (target ≥ 50%)")
        print(f"  off      {result['off_vs_plain']:.1%} of plain (the schema attributes on every frame)")
