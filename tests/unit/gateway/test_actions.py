"""Input rules of the gateway's actions and its error mapping (no broker needed)."""

from __future__ import annotations

import grpc
import pytest

from danube.errors import InvalidArgumentError, NotFoundError, PermissionDeniedError
from danube.gateway.actions import normalize_topic, parse_body
from danube.gateway.errors import GatewayRequestError, error_body, from_rpc_error, http_status


@pytest.mark.parametrize(
    "topic, namespace, expected",
    [
        ("/default/orders", None, "/default/orders"),
        ("default/orders", None, "/default/orders"),
        ("orders", "default", "/default/orders"),
    ],
)
def test_danube_topic_forms(topic, namespace, expected):
    assert normalize_topic(topic, namespace) == expected


@pytest.mark.parametrize(
    "topic, namespace",
    [
        ("orders", None),
        ("/default/../x", None),
        ("a/b/c/d", None),
        ("/default/x y", None),
        ("x", "../ns"),
        ("/" + "a" * 300 + "/t", None),
    ],
)
def test_names_outside_the_broker_rule_are_refused(topic, namespace):
    with pytest.raises(InvalidArgumentError):
        normalize_topic(topic, namespace)


def test_bodies_must_be_json_objects():
    assert parse_body(b'{"a": 1}') == {"a": 1}
    assert parse_body(b"") == {}
    for bad in (b"[1]", b"nope", b"\xff"):
        with pytest.raises(GatewayRequestError):
            parse_body(bad)


class _Rpc(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def test_broker_statuses_become_project_errors_and_http_statuses():
    err = from_rpc_error(_Rpc(grpc.StatusCode.NOT_FOUND, "topic /d/t not found"))
    assert isinstance(err, NotFoundError) and http_status(err) == 404
    assert error_body(err) == {"error": "topic /d/t not found", "message": "topic /d/t not found", "code": "NotFound"}
    err = from_rpc_error(_Rpc(grpc.StatusCode.PERMISSION_DENIED, "no"))
    assert isinstance(err, PermissionDeniedError) and http_status(err) == 403
    assert http_status(from_rpc_error(_Rpc(grpc.StatusCode.DEADLINE_EXCEEDED, "slow"))) == 504
    assert http_status(from_rpc_error(_Rpc(grpc.StatusCode.UNAVAILABLE, "down"))) == 502
    assert http_status(from_rpc_error(_Rpc(grpc.StatusCode.UNIMPLEMENTED, "standalone"))) == 501
    assert http_status(GatewayRequestError("big", 413)) == 413
