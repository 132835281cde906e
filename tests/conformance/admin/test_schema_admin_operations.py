"""danube-admin/tests/schema_admin_operations.rs: compatibility get/set, a topic's schema
configuration and validation policy, deleting a schema version."""

from __future__ import annotations

import json

SCHEMA_V1 = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "AdminTestEvent",
    "type": "object",
    "required": ["event_id", "action"],
    "properties": {"event_id": {"type": "string"}, "action": {"type": "string"}},
}
# v1 plus an optional property: compatible under FULL
SCHEMA_V2 = {**SCHEMA_V1, "properties": {**SCHEMA_V1["properties"], "metadata": {"type": "string"}}}


def test_schema_admin_operations(cli, tmp_path):
    ns = cli.unique_ns()
    topic = f"/{ns}/admin-test-events"
    subject = f"admin-events-schema-{cli.syntax}"  # both syntaxes share one broker
    cli.create_ns(ns)
    v1 = tmp_path / "admin_test_schema.json"
    v1.write_text(json.dumps(SCHEMA_V1, indent=2))
    cli.ok("schemas", "register", subject, "--schema-type", "json_schema", "--file", str(v1))

    # the default mode
    r = cli.ok("schemas", "get-compatibility", subject, "--output", "json")
    assert "BACKWARD" in r.stdout
    assert json.loads(r.stdout) == {"subject": subject, "compatibility_mode": "BACKWARD"}

    r = cli.ok("schemas", "set-compatibility", subject, "--mode", "full")
    assert "Compatibility mode set" in r.stdout and "FULL" in r.stdout
    assert "FULL" in cli.ok("schemas", "get-compatibility", subject).stdout

    # a topic's schema configuration
    cli.ok("topics", "create", topic)
    r = cli.ok(
        "topics",
        "configure-schema",
        topic,
        "--subject",
        subject,
        "--validation-policy",
        "enforce",
        "--enable-payload-validation",
    )
    for text in ("Schema configuration set", subject, "ENFORCE", "ENABLED"):
        assert text in r.stdout, r.stdout

    config = json.loads(cli.ok("topics", "get-schema-config", topic, "--output", "json").stdout)
    assert config["schema_subject"] == subject
    assert config["validation_policy"] == "ENFORCE"
    assert config["enable_payload_validation"] is True

    r = cli.ok("topics", "set-validation-policy", topic, "--policy", "warn", "--enable-payload-validation")
    assert "Validation policy updated" in r.stdout and "WARN" in r.stdout
    config = json.loads(cli.ok("topics", "get-schema-config", topic, "--output", "json").stdout)
    assert config["validation_policy"] == "WARN"

    # configure-schema without --enable-payload-validation
    topic2 = f"/{ns}/admin-test-events-2"
    cli.ok("topics", "create", topic2)
    r = cli.ok("topics", "configure-schema", topic2, "--subject", subject, "--validation-policy", "none")
    assert "DISABLED" in r.stdout

    # a second version, then deleted
    v2 = tmp_path / "admin_test_schema_v2.json"
    v2.write_text(json.dumps(SCHEMA_V2, indent=2))
    r = cli("schemas", "register", subject, "--schema-type", "json_schema", "--file", str(v2))
    assert r.ok, r.stderr
    assert "Version: 2" in r.stdout
    r = cli.ok("schemas", "delete", subject, "--version", "2", "--confirm")
    assert "Deleted version 2" in r.stdout

    # deletion needs --confirm
    assert not cli("schemas", "delete", subject, "--version", "1").ok
    assert '"version": 1' in cli.ok("schemas", "versions", subject, "--output", "json").stdout

    cli.ok("topics", "delete", topic)
    cli.ok("topics", "delete", topic2)
    cli.delete_ns(ns)
