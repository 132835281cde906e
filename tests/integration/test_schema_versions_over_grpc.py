"""Spark's decode=schema looks a subject's versions up from a running broker's registry (gRPC)."""

from __future__ import annotations

import json

import grpc
import pytest

from danube.proto.danube_schema import SchemaRegistry_pb2 as pb
from danube.proto.danube_schema import SchemaRegistry_pb2_grpc as pb_grpc
from danube.spark.schema_decode import load_versions, plan
from tests.support.broker import running_broker

pytestmark = pytest.mark.timeout(120)

V1 = {"type": "record", "name": "U", "fields": [{"name": "id", "type": "long"}]}
V2 = {
    "type": "record",
    "name": "U",
    "fields": [{"name": "id", "type": "long"}, {"name": "n", "type": "string", "default": ""}],
}


def test_load_versions_from_a_broker():
    with running_broker() as broker, grpc.insecure_channel(broker.target) as channel:
        stub = pb_grpc.SchemaRegistryStub(channel)
        for doc in (V1, V2):
            stub.RegisterSchema(
                pb.RegisterSchemaRequest(subject="u", schema_type="avro", schema_definition=json.dumps(doc).encode()),
                timeout=30,
            )
        stub.DeleteSchemaVersion(pb.DeleteSchemaVersionRequest(subject="u", version=1), timeout=30)
        resp = stub.ConfigureTopicSchema(
            pb.ConfigureTopicSchemaRequest(topic_name="/default/u", schema_subject="u", validation_policy="warn"),
            timeout=30,
        )
        assert resp.success, resp.message
        by_subject = load_versions({"schemaRegistry": broker.url, "subject": "u"})
        by_topic = load_versions({"schemaRegistry": broker.url, "topic": "/default/u"})
    for sv in (by_subject, by_topic):
        assert (sv.subject, sv.schema_type, sv.latest) == ("u", "avro", 2)
        assert json.loads(sv.definitions[2]) == V2
    assert plan(by_topic).ddl.endswith("`id` bigint, `n` string")
