"""`danube admin schemas ...`, `danube produce --schema-subject` and `danube consume --print`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.broker import running_broker

pytestmark = pytest.mark.timeout(180)
DANUBE = [sys.executable, "-m", "danube.cli.main"]
USER = {
    "type": "record",
    "name": "User",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}


@pytest.fixture(scope="module")
def broker():
    with running_broker("--sync", "interval") as b:
        yield b


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*DANUBE, *args], capture_output=True, text=True, timeout=timeout)


def admin(broker, *args: str) -> subprocess.CompletedProcess:
    return run("admin", "--endpoint", f"http://127.0.0.1:{broker.admin_port}", *args)


def test_schema_admin_produce_consume(broker, tmp_path):
    v1 = tmp_path / "user.avsc"
    v1.write_text(json.dumps(USER))
    r = admin(
        broker,
        "--output",
        "json",
        "schemas",
        "register",
        "cli-users",
        "--schema-type",
        "avro",
        "--file",
        str(v1),
        "--description",
        "users",
        "--tags",
        "a",
        "b",
    )
    assert r.returncode == 0, r.stderr
    reg = json.loads(r.stdout)
    assert reg["version"] == 1 and reg["is_new_version"] is True
    r = admin(broker, "schemas", "register", "cli-users", "--schema-type", "avro", "--schema", json.dumps(USER))
    assert r.returncode == 0 and "Schema already exists" in r.stdout

    bad = {**USER, "fields": USER["fields"] + [{"name": "age", "type": "int"}]}
    r = admin(broker, "schemas", "check", "cli-users", "--schema-type", "avro", "--schema", json.dumps(bad))
    assert r.returncode == 1 and "NOT compatible" in r.stdout and "age" in r.stdout
    r = admin(
        broker,
        "schemas",
        "check",
        "cli-users",
        "--schema-type",
        "avro",
        "--schema",
        json.dumps(bad),
        "--mode",
        "forward",
    )
    assert r.returncode == 0 and "is compatible" in r.stdout
    r = admin(broker, "schemas", "register", "cli-users", "--schema-type", "avro", "--schema", json.dumps(bad))
    assert r.returncode == 1 and "invalid_argument" in r.stderr and "backward" in r.stderr
    r = admin(broker, "schemas", "compatibility", "cli-users", "--mode", "none")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        admin(
            broker, "schemas", "register", "cli-users", "--schema-type", "avro", "--schema", json.dumps(bad)
        ).returncode
        == 0
    )
    r = admin(broker, "--output", "json", "schemas", "versions", "cli-users")
    assert [v["version"] for v in json.loads(r.stdout)] == [1, 2]
    r = admin(broker, "schemas", "delete", "cli-users", "--version", "2")
    assert r.returncode == 2  # needs --confirm
    assert admin(broker, "schemas", "delete", "cli-users", "--version", "2", "--confirm").returncode == 0
    r = admin(broker, "--output", "json", "schemas", "get", "--subject", "cli-users")
    got = json.loads(r.stdout)
    assert (got["version"], got["schema_type"], got["tags"]) == (1, "avro", ["a", "b"])
    assert json.loads(got["schema_definition"]) == USER
    r = admin(broker, "schemas", "get", "--id", str(reg["schema_id"]), "--version", "1")
    assert r.returncode == 0 and "Subject: cli-users" in r.stdout

    topic = "/default/cli-schema"
    r = run("consume", "--service-url", broker.url, "--topic", topic, "--subscription", "s", "--timeout", "0.2")
    assert r.returncode == 0, r.stderr
    r = run(
        "produce",
        "--service-url",
        broker.url,
        "--topic",
        topic,
        "--count",
        "3",
        "--schema-subject",
        "cli-users",
        "--message",
        '{"id": 7, "name": "ann"}',
    )
    assert r.returncode == 0, r.stderr
    r = run(
        "produce",
        "--service-url",
        broker.url,
        "--topic",
        topic,
        "--count",
        "1",
        "--schema-subject",
        "cli-users",
        "--message",
        '{"id": "seven"}',
    )
    assert r.returncode == 1 and "does not fit" in r.stderr
    r = run(
        "consume",
        "--service-url",
        broker.url,
        "--topic",
        topic,
        "--subscription",
        "s",
        "--count",
        "3",
        "--timeout",
        "10",
        "--print",
    )
    assert r.returncode == 0, r.stderr
    assert [json.loads(line) for line in r.stdout.splitlines()] == [{"id": 7, "name": "ann"}] * 3
    # the batch-lane producer's subject went to the topic (as Danube's CreateProducer with schema_ref)
    cfg = json.loads(admin(broker, "--output", "json", "schemas", "topic-config", topic).stdout)
    assert (cfg["schema_subject"], cfg["validation_policy"]) == ("cli-users", "NONE")

    r = admin(
        broker,
        "schemas",
        "configure-topic",
        topic,
        "--subject",
        "cli-users",
        "--policy",
        "enforce",
        "--payload-validation",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = admin(broker, "--output", "json", "schemas", "topic-config", topic)
    cfg = json.loads(r.stdout)
    assert (cfg["schema_subject"], cfg["validation_policy"], cfg["enable_payload_validation"]) == (
        "cli-users",
        "ENFORCE",
        True,
    )
    r = run("produce", "--service-url", broker.url, "--topic", topic, "--count", "5", "--size", "10")
    assert r.returncode == 1 and "no schema id" in r.stderr
    r = run(
        "produce",
        "--service-url",
        broker.url,
        "--topic",
        topic,
        "--count",
        "5",
        "--schema-subject",
        "cli-users",
        "--message",
        '{"id": 8, "name": "bo"}',
    )
    assert r.returncode == 0, r.stderr
