"""The schema registry end to end with the real danube-client 0.5.0 (its own venv)."""

from __future__ import annotations

import pytest

from tests.support import danube_client_venv as dc
from tests.support.broker import running_broker

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def flow():
    try:
        dc.ensure_venv()
    except Exception as exc:  # noqa: BLE001 - no network / no package index
        pytest.skip(f"danube-client venv not available: {exc}")
    with running_broker() as broker:
        yield dc.run_script("schema_flow.py", broker.url, "/default/schema-users", timeout=180)


def test_register_and_read_back(flow):
    r = flow["register"]
    assert r["id"] >= 1 and r["again"] == r["id"]  # identical schema → the same id
    assert (r["version"], r["subject"], r["type"]) == (1, "users", "avro")
    assert len(r["fingerprint"]) == 64 and r["definition"]["name"] == "User"
    assert flow["invalid"].startswith("INVALID_ARGUMENT") and "avro" in flow["invalid"]


@pytest.mark.parametrize("stype", ["avro", "json_schema", "protobuf"])
@pytest.mark.parametrize("mode", ["none", "backward", "forward", "full"])
def test_evolution_under_each_mode(flow, stype, mode):
    row = flow["evolution"][f"{stype}-{mode}"]
    assert row["set_mode"] is True
    assert row["allowed_check"] == [True, []]
    assert row["versions"] == [1, 2]
    if mode != "none":
        ok, reasons = row["refused_check"]
        assert ok is False and reasons, row
        assert row["refused_register"].startswith("INVALID_ARGUMENT"), row
        assert "compatible" in row["refused_register"]


def test_versions_pinned_and_delete(flow):
    assert flow["pinned"] == [2, 1, True]
    assert flow["delete"][0] is True
    assert flow["after_delete"] == [1]


def test_produce_with_schema_subject_and_consume(flow):
    consumed = flow["consumed"]
    assert [m["payload"] for m in consumed] == flow["expected_payloads"]
    sid = flow["register"]["id"]
    assert all(m["schema_id"] == sid and m["schema_version"] == 1 for m in consumed)
    assert all(set(m["attributes"]) == {"n"} for m in consumed)  # the schema pair is not an attribute
    assert "users" in flow["topic_config"]  # the producer's subject went to the topic


def test_enforce_refuses_bad_publishes(flow):
    assert flow["configure"][0] is True
    assert flow["enforce_no_schema"].startswith("INVALID_ARGUMENT")
    assert "no schema id" in flow["enforce_no_schema"]
    assert flow["update_policy"][0] is True
    assert flow["enforce_bad_payload"].startswith("INVALID_ARGUMENT")
    assert "does not match" in flow["enforce_bad_payload"]
    assert flow["config"] == ["users", "enforce", True, flow["register"]["id"]]
