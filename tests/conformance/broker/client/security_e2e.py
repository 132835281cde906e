"""danube-broker/tests/security_e2e.rs: TLS + JWT, and RBAC bindings decide who may produce.

As in Danube's security workflow, the environment names the CA and the tokens
(DANUBE_CA_CERT, DANUBE_AUTHORIZED_TOKEN, DANUBE_DENIED_TOKEN); the bindings were made before.
The tests run in order (``--parallel 1``): the consume test follows the produce test.
"""

import asyncio
import os

from danube import DanubeClientBuilder, SubType

TOPIC = "/default/security-test"


def env(name: str) -> str:
    value = os.environ.get(name)
    assert value, f"{name} env var must be set"
    return value


async def build_client(ctx, token: str):
    return await DanubeClientBuilder().service_url(ctx.url).with_tls(env("DANUBE_CA_CERT")).with_token(token).build()


async def test_security_authorized_produce(ctx):
    client = await build_client(ctx, env("DANUBE_AUTHORIZED_TOKEN"))
    producer = client.new_producer().with_topic(TOPIC).with_name("security-e2e-producer").build()
    await producer.create()
    await asyncio.sleep(0.3)
    try:
        await producer.send(b"security-e2e-message", None)
    except Exception as exc:  # noqa: BLE001 - reported as Danube's assertion does
        raise AssertionError(f"Authorized producer should be able to send a message, got: {exc!r}") from exc


async def test_security_authorized_consume(ctx):
    client = await build_client(ctx, env("DANUBE_AUTHORIZED_TOKEN"))
    consumer = (
        client.new_consumer()
        .with_topic(TOPIC)
        .with_consumer_name("security-e2e-consumer")
        .with_subscription("security-e2e-sub")
        .with_subscription_type(SubType.EXCLUSIVE)
        .build()
    )
    try:
        await consumer.subscribe()
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"Authorized consumer should be able to subscribe, got: {exc!r}") from exc


async def test_security_denied_produce(ctx):
    client = await build_client(ctx, env("DANUBE_DENIED_TOKEN"))
    producer = client.new_producer().with_topic(TOPIC).with_name("security-e2e-denied-producer").build()
    try:
        await producer.create()
    except Exception as exc:  # noqa: BLE001 - the refusal is the observation
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        message = f"{exc} {cause!r}"
        assert "PermissionDenied" in message or "permission" in message.lower(), (
            f"Error should be permission-related, got: {message}"
        )
    else:
        raise AssertionError("Unprivileged principal should be denied producer creation")
