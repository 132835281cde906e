"""The gateway in front of a TLS + JWT + RBAC broker: it reads with its own token over TLS (as
`danube admin` does), demands a token for actions, and hands the caller's token to the broker, whose
RBAC decides (a token without the admin role is refused there, not waved through by the gateway)."""

from __future__ import annotations

import os

from danube.security.jwt import issue_token
from tests.support.broker import running_broker
from tests.support.certs import make_pki
from tests.support.gateway import running_gateway

SECRET = "gateway-secret-0123456789abcdef-0123"


def test_secure_broker_behind_the_gateway(tmp_path):
    pki = make_pki(str(tmp_path / "pki"))
    secret = tmp_path / "jwt-secret"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    ops, bob = issue_token("ops", SECRET), issue_token("bob", SECRET)
    (tmp_path / "broker").mkdir()
    with running_broker(
        "--tls-cert",
        pki.server.cert,
        "--tls-key",
        pki.server.key,
        "--jwt-secret-file",
        str(secret),
        "--super-admin",
        "ops",
        data_dir=str(tmp_path / "broker"),
    ) as broker:
        with running_gateway(
            broker.admin_port, str(tmp_path), "--grpc-ca", pki.ca, env={"DANUBE_ADMIN_TOKEN": ops}
        ) as gw:
            cluster = gw.get("/ui/v1/cluster")
            assert cluster["brokers"][0]["broker_addr"] == f"https://127.0.0.1:{broker.port}"
            body = {"action": "create", "topic": "/default/secured"}
            status, doc, _ = gw.request("POST", "/ui/v1/topics/actions", body)
            assert status == 401 and "token" in doc["message"]
            status, doc, _ = gw.request(
                "POST", "/ui/v1/topics/actions", body, headers={"Authorization": f"Bearer {bob}"}
            )
            assert status == 403 and doc["code"] == "PermissionDenied", doc
            status, doc, _ = gw.request(
                "POST", "/ui/v1/topics/actions", body, headers={"Authorization": f"Bearer {ops}"}
            )
            assert (status, doc["success"]) == (200, True), doc
            assert "/default/secured" in [t for n in gw.get("/ui/v1/namespaces")["namespaces"] for t in n["topics"]]

        # without a token of its own the gateway gets the broker's refusal, as a clear 401
        with running_gateway(broker.admin_port, str(tmp_path), "--grpc-ca", pki.ca) as gw:
            status, doc, _ = gw.request("GET", "/ui/v1/cluster")
            assert status == 401 and doc["code"] == "Unauthenticated", doc
            assert gw.request("GET", "/ui/v1/health")[1]["leader_reachable"] is False
