"""The schema registry through the real danube-client: prints one JSON result as its last line.

usage: schema_flow.py URL TOPIC

Registers, reads back, evolves subjects of each type under each compatibility mode (a change
the mode allows and one it refuses), produces Avro records with .with_schema_subject, consumes
them (schema id and version on each StreamMessage), then configures the topic to enforce and
tries bad publishes.  Avro is encoded by hand here (the client venv has no Avro library).
"""

import argparse
import asyncio
import json

import grpc

from danube import CompatibilityMode, DanubeClientBuilder, DispatchStrategy, SchemaType, SubType


def zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def avro_user(i: int, name: str) -> bytes:
    raw = name.encode()
    return zigzag(i) + zigzag(len(raw)) + raw


def record(fields, name="User"):
    return json.dumps({"type": "record", "name": name, "fields": fields}).encode()


ID = {"name": "id", "type": "long"}
NAME = {"name": "name", "type": "string"}
OPT = {"name": "email", "type": ["null", "string"], "default": None}
REQ = {"name": "age", "type": "int"}
OBJ = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}, "required": ["id"]}


def js(doc):
    return json.dumps(doc).encode()


PROTO = 'syntax = "proto3"; package e2e; message User {{ int64 id = 1; {rest} }}'

# subject type -> (base, {mode: (allowed change, refused change)})
CASES = {
    SchemaType.AVRO: (
        record([ID, NAME]),
        {
            "backward": (record([ID, NAME, OPT]), record([ID, NAME, REQ])),
            "forward": (record([ID, NAME, REQ]), record([ID])),
            "full": (record([ID, NAME, OPT]), record([ID, NAME, REQ])),
            "none": (record([ID, {"name": "name", "type": "boolean"}]), None),
        },
    ),
    SchemaType.JSON_SCHEMA: (
        js(OBJ),
        {
            "backward": (
                js({**OBJ, "properties": {**OBJ["properties"], "email": {"type": "string"}}}),
                js({**OBJ, "required": ["id", "name"]}),
            ),
            "forward": (
                js({**OBJ, "required": ["id", "name"]}),
                js({**OBJ, "properties": {"id": {"type": "number"}, "name": {"type": "string"}}}),
            ),
            "full": (js({**OBJ, "description": "users"}), js({**OBJ, "properties": {"id": {"type": "string"}}})),
            "none": (js({"type": "array"}), None),
        },
    ),
    SchemaType.PROTOBUF: (
        PROTO.format(rest="string name = 2;").encode(),
        {
            "backward": (
                PROTO.format(rest="string name = 2; string email = 3;").encode(),
                PROTO.format(rest="int32 name = 2;").encode(),
            ),
            "forward": (
                PROTO.format(rest="string name = 2; string email = 3;").encode(),
                PROTO.format(rest="repeated string name = 2;").encode(),
            ),
            "full": (
                PROTO.format(rest="string full_name = 2;").encode(),
                PROTO.format(rest="double name = 2;").encode(),
            ),
            "none": (PROTO.format(rest="double name = 2;").encode(), None),
        },
    ),
}


def code_of(exc) -> str:
    cause = exc if isinstance(exc, grpc.aio.AioRpcError) else exc.__cause__
    if isinstance(cause, grpc.aio.AioRpcError):
        return f"{cause.code().name}: {cause.details()}"
    return f"{type(exc).__name__}: {exc}"


async def main(a) -> dict:
    out: dict = {}
    client = await DanubeClientBuilder().service_url(a.url).build()
    reg = client.schema()

    # ---- register and read back
    v1 = record([ID, NAME])
    sid = await (
        reg.register_schema("users")
        .with_type(SchemaType.AVRO)
        .with_schema_data(v1)
        .with_description("users v1")
        .with_created_by("e2e")
        .with_tags(["pii"])
        .execute()
    )
    again = (
        await reg.register_schema("users")
        .with_type(SchemaType.AVRO)
        .with_schema_data(json.dumps(json.loads(v1), indent=2).encode())
        .execute()
    )
    info = await reg.get_schema_by_id(sid)
    out["register"] = {
        "id": sid,
        "again": again,
        "version": info.version,
        "subject": info.subject,
        "type": info.schema_type,
        "fingerprint": info.fingerprint,
        "definition": json.loads(info.schema_definition),
    }
    try:
        await reg.register_schema("broken").with_type(SchemaType.AVRO).with_schema_data(b'{"type": "rec"}').execute()
        out["invalid"] = None
    except Exception as exc:  # noqa: BLE001
        out["invalid"] = code_of(exc)

    # ---- evolution under each mode
    evolution = {}
    for stype, (base, modes) in CASES.items():
        for mode, (allowed, refused) in modes.items():
            subject = f"{stype.value}-{mode}"
            await reg.register_schema(subject).with_type(stype).with_schema_data(base).execute()
            ok, msg = await reg.set_compatibility_mode(subject, CompatibilityMode.parse(mode))
            row = {"set_mode": ok}
            row["allowed_check"] = list(await reg.check_compatibility(subject, allowed, stype))
            await reg.register_schema(subject).with_type(stype).with_schema_data(allowed).execute()
            row["versions"] = await reg.list_versions(subject)
            if refused is not None:
                row["refused_check"] = list(await reg.check_compatibility(subject, refused, stype))
                try:
                    await reg.register_schema(subject).with_type(stype).with_schema_data(refused).execute()
                    row["refused_register"] = None
                except Exception as exc:  # noqa: BLE001
                    row["refused_register"] = code_of(exc)
            evolution[subject] = row
    out["evolution"] = evolution
    latest = await reg.get_latest_schema("avro-backward")
    pinned = await reg.get_schema_version(latest.schema_id, 1)
    out["pinned"] = [latest.version, pinned.version, pinned.schema_id == latest.schema_id]
    out["delete"] = list(await reg.delete_schema_version("avro-backward", 2))
    out["after_delete"] = await reg.list_versions("avro-backward")

    # ---- produce with .with_schema_subject and consume
    topic = a.topic
    consumer = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name("c1")
        .with_subscription("s1")
        .with_subscription_type(SubType.EXCLUSIVE)
        .build()
    )
    producer = (
        client.new_producer()
        .with_topic(topic)
        .with_name("p-schema")
        .with_schema_subject("users")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        .build()
    )
    await producer.create()
    await consumer.subscribe()
    queue = await consumer.receive()
    for i in range(5):
        await producer.send(avro_user(i, f"user-{i}"), {"n": str(i)})
    got = []
    for _ in range(5):
        msg = await asyncio.wait_for(queue.get(), 20)
        got.append(
            {
                "payload": msg.payload.hex(),
                "schema_id": msg.schema_id if msg.HasField("schema_id") else None,
                "schema_version": msg.schema_version if msg.HasField("schema_version") else None,
                "attributes": dict(msg.attributes),
            }
        )
        await consumer.ack(msg)
    out["consumed"] = got
    out["expected_payloads"] = [avro_user(i, f"user-{i}").hex() for i in range(5)]
    out["topic_config"] = str(await reg.get_topic_schema_config(topic))

    # ---- enforce: a publish without a schema, then a bad payload, are refused
    ok, msg = await reg.configure_topic_schema(topic, "users", "enforce", False)
    out["configure"] = [ok, msg]
    plain = (
        client.new_producer()
        .with_topic(topic)
        .with_name("p-plain")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        .build()
    )
    await plain.create()
    try:
        await plain.send(b"no schema here")
        out["enforce_no_schema"] = None
    except Exception as exc:  # noqa: BLE001
        out["enforce_no_schema"] = code_of(exc)
    await producer.send(b"\xff\xff\xff garbage")  # ids only: accepted
    ok, msg = await reg.update_topic_validation_policy(topic, "enforce", True)
    out["update_policy"] = [ok, msg]
    try:
        await producer.send(b"\xff\xff\xff garbage")
        out["enforce_bad_payload"] = None
    except Exception as exc:  # noqa: BLE001
        out["enforce_bad_payload"] = code_of(exc)
    await producer.send(avro_user(99, "good"))
    cfg = await reg.get_topic_schema_config(topic)
    out["config"] = [cfg.schema_subject, cfg.validation_policy, cfg.enable_payload_validation, cfg.schema_id]
    await producer.close()
    await plain.close()
    await consumer.close()
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("topic")
    print(json.dumps(asyncio.run(main(p.parse_args()))))
