"""Security pieces on their own: JWT verify/issue and its cache, RBAC grants and patterns,
the auth config block, OpenSSH's world-readable rule, the guard's principal and checks."""

from __future__ import annotations

import asyncio
import os
import ssl
import time

import grpc
import pytest

from danube.errors import AuthenticationError, InvalidArgumentError, PermissionDeniedError
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.security.jwt import TokenVerifier, issue_token, parse_duration
from danube.security.rbac import ANY_RESOURCE, CLUSTER, Authorizer, Grant
from danube.security.settings import AuthSettings, with_flags
from danube.security.tls import identity_of, server_ssl_context
from danube.server import status
from danube.server.auth.guard import CallGuard, rule_for
from danube.server.config import BrokerConfig

SECRET = "unit-test-secret-0123456789abcdef-xyz"


# ---------------------------------------------------------------- JWT


def test_token_round_trip_and_cache():
    verifier = TokenVerifier(SECRET, issuer="danube-auth")
    token = issue_token("alice", SECRET, expires_in_s=60)
    assert verifier.subject(token) == "alice"
    assert verifier.subject(token) == "alice"
    assert verifier.verified == 1  # the second call was a cache hit


@pytest.mark.parametrize(
    "token, needle",
    [
        (lambda: issue_token("alice", SECRET, now=time.time() - 7200, expires_in_s=60), "expired"),
        (lambda: issue_token("alice", "another-secret-0123456789abcdef-xyz"), "forged"),
        (lambda: issue_token("alice", SECRET, issuer="someone-else"), "issuer"),
        (lambda: "not-a-jwt", "malformed"),
    ],
)
def test_bad_tokens_say_why(token, needle):
    verifier = TokenVerifier(SECRET, issuer="danube-auth")
    with pytest.raises(AuthenticationError, match=needle) as info:
        verifier.subject(token())
    assert status.status_for(info.value) == grpc.StatusCode.UNAUTHENTICATED


def test_a_cached_token_still_expires():
    clock = [time.time()]
    verifier = TokenVerifier(SECRET, issuer="danube-auth", clock=lambda: clock[0])
    token = issue_token("alice", SECRET, now=clock[0], expires_in_s=60)
    assert verifier.subject(token) == "alice"
    assert verifier.subject(token) == "alice" and verifier.verified == 1  # from the cache
    clock[0] += 61
    with pytest.raises(AuthenticationError, match="expired"):
        verifier.subject(token)


def test_token_without_expiry_is_refused():
    import jwt as pyjwt

    token = pyjwt.encode({"sub": "alice", "iss": "danube-auth"}, SECRET, algorithm="HS256")
    with pytest.raises(AuthenticationError, match="'exp'"):
        TokenVerifier(SECRET, issuer="danube-auth").subject(token)


def test_durations():
    assert parse_duration("90") == 90 and parse_duration("15m") == 900 and parse_duration("30d") == 30 * 86400
    with pytest.raises(InvalidArgumentError):
        parse_duration("soon")


# ---------------------------------------------------------------- RBAC


@pytest.mark.parametrize(
    "grant, permission, resource, expected",
    [
        ("produce:/default/*", "produce", "/default/orders", True),
        ("produce:/default/*", "consume", "/default/orders", False),
        ("produce:/default/*", "produce", "/other/orders", False),
        ("produce:/default/orders", "produce", "/default/orders-part-3", True),  # partitions of T
        ("produce:/default/orders", "produce", "/default/orders2", False),
        ("produce:/default/orders", "produce", "/default/orders.seg.0000-7fff-1", True),  # segments of T
        ("produce:/default/orders", "produce", "/default/orders2.seg.0000-7fff-1", False),
        ("produce:/default/orders", "produce", "/default/orders.seg.x", False),
        ("admin:/default/*", "admin", "/default", True),  # the namespace itself
        ("admin:/default/*", "admin", CLUSTER, False),
        ("admin:*", "admin", CLUSTER, True),
        ("lookup:/a/*", "lookup", ANY_RESOURCE, True),
    ],
)
def test_grants(grant, permission, resource, expected):
    assert Grant.parse(grant).covers(permission, resource) is expected


@pytest.mark.parametrize("text", ["write:/default/*", "produce", "produce:", "produce:default/*"])
def test_bad_grants(text):
    with pytest.raises(InvalidArgumentError):
        Grant.parse(text)


def test_authorizer_default_deny_bindings_and_super_admins(tmp_path):
    async def main():
        store = EmbeddedMetadataStore(str(tmp_path / "m.db"))
        authz = Authorizer(store, super_admins=["root"], refresh_s=0)
        await authz.start()
        with pytest.raises(PermissionDeniedError, match="'produce' on /default/t denied to 'alice'") as info:
            authz.check("alice", "produce", "/default/t")
        assert status.status_for(info.value) == grpc.StatusCode.PERMISSION_DENIED
        authz.check("root", "admin", CLUSTER)
        await authz.put_role("writer", ["produce:/default/*", "lookup:/default/*"])
        with pytest.raises(Exception, match="unknown role"):
            await authz.bind("alice", ["nope"])
        await authz.bind("alice", ["writer"])
        authz.check("alice", "produce", "/default/t")
        with pytest.raises(PermissionDeniedError):
            authz.check("alice", "consume", "/default/t")
        # Another broker (a second Authorizer on the same store) sees the same state.
        other = Authorizer(store, refresh_s=0)
        await other.load()
        other.check("alice", "lookup", "/default/x")
        await authz.unbind("alice")
        with pytest.raises(PermissionDeniedError):
            authz.check("alice", "produce", "/default/t")
        await authz.stop()
        await store.close()

    asyncio.run(main())


# ---------------------------------------------------------------- the guard


class _Broker:
    cluster = None

    def registered_topic(self, kind, client_id):
        return None

    def producer_topic(self, producer_id):
        return {7: "/default/t"}.get(producer_id)

    def consumer_info(self, consumer_id):
        return None


def test_guard_principal_and_rules(tmp_path):
    verifier = TokenVerifier(SECRET, issuer="danube-auth")
    guard = CallGuard(verifier=verifier, authorizer=None, broker=_Broker(), accept_client_certificates=True)
    token = issue_token("alice", SECRET)
    assert guard.principal((("authorization", f"Bearer {token}"),), None) == "alice"
    assert guard.principal((), lambda: {"subject": ((("commonName", "client-1"),),)}) == "client-1"
    with pytest.raises(AuthenticationError, match="no credentials"):
        guard.principal((), lambda: None)
    with pytest.raises(AuthenticationError, match="Bearer"):
        guard.principal((("authorization", "Basic abc"),), None)
    permission, resolver = rule_for("/danube.ProducerService/SendMessage")

    class Msg:
        class msg_id:
            producer_id = 7

    assert (permission, resolver(Msg, _Broker())) == ("produce", "/default/t")
    assert rule_for("/danube_admin.TopicAdmin/UnloadTopic")[0] == "admin"
    assert rule_for("/some.Unknown/Method")[0] == "admin"  # default-deny: admins only
    assert rule_for("/danube.HealthCheck/HealthCheck") == (None, None)
    assert rule_for("/danube_batch.BatchLane/Health") == (None, None)  # the same check for many ids


@pytest.mark.parametrize(
    "method, permission",
    [
        ("WatchTopic", "lookup"),
        ("GetScalableTopic", "lookup"),
        ("RegisterConsumer", "consume"),
        ("SegmentDrained", "consume"),
        ("CreateSubscription", "consume"),
        ("SplitSegment", "admin"),
        ("MergeSegments", "admin"),
        ("DeleteScalableTopic", "admin"),
        ("CreateScalableTopic", "admin"),
    ],
)
def test_scalable_topic_calls_are_judged_on_their_topic(method, permission):
    rule, resolver = rule_for(f"/danube_scalable.ScalableTopics/{method}")

    class Request:
        topic = "/default/orders"

    assert (rule, resolver(Request, _Broker())) == (permission, "/default/orders")
    # the broker-to-broker calls stay with cluster admins
    assert rule_for("/danube_scalable.ScalableTopics/TerminateSegment")[1](Request, _Broker()) == CLUSTER
    listed = rule_for("/danube_scalable.ScalableTopics/ListScalableTopics")[1]

    class ListRequest:
        namespace = "default"

    assert listed(ListRequest, _Broker()) == "/default"


def test_a_scalable_producer_may_ask_what_it_stored_in_a_segment_it_publishes_to():
    rule, resolver = rule_for("/danube_scalable.ScalableTopics/StoredMessages")

    class Request:
        segment_topic = "/default/orders.seg.0000-ffff-0"

    assert (rule, resolver(Request, _Broker())) == ("produce", "/default/orders.seg.0000-ffff-0")
    assert Grant.parse("produce:/default/orders").covers(rule, Request.segment_topic)


def test_identity_of_both_servers():
    assert identity_of({"x509_common_name": [b"client-1"]}) == "client-1"
    assert identity_of({"subject": ((("commonName", "c2"),),)}) == "c2"
    assert identity_of(None) is None


# ---------------------------------------------------------------- config


def _pki(tmp_path):
    from tests.support.certs import make_pki

    return make_pki(str(tmp_path / "pki"))


def test_auth_block_parses_and_hides_the_secret(tmp_path):
    pki = _pki(tmp_path)
    config = BrokerConfig.from_dict(
        {
            "auth": {
                "mode": "tls",
                "tls": {
                    "cert_file": pki.server.cert,
                    "key_file": pki.server.key,
                    "ca_file": pki.ca,
                    "verify_client": True,
                },
                "jwt": {"secret_key": SECRET, "issuer": "danube-auth", "expiration_time": 600},
                "super_admins": ["admin"],
            }
        }
    )
    auth = config.auth
    assert auth.tls_enabled and auth.mtls and auth.authenticating and auth.jwt.expiration_time == 600
    assert SECRET not in repr(config) and SECRET not in auth.describe()
    auth.check_files()
    ctx = server_ssl_context(pki.server.cert, pki.server.key, ca_file=pki.ca, verify_client=True)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert AuthSettings.from_dict({"mode": "tls", "tls": {"cert_file": "a", "key_file": "b"}}).mode == "tls"
    jwt_doc = {"secret_key": SECRET}
    assert (
        AuthSettings.from_dict({"mode": "tlswithjwt", "tls": {"cert_file": "a", "key_file": "b"}, "jwt": jwt_doc}).mode
        == "tls"
    )
    # Danube's mode none: nothing is on, whatever else the block holds (and no file is checked).
    off = AuthSettings.from_dict({"mode": "none", "tls": {"cert_file": "/nope", "key_file": "/nope"}, "jwt": jwt_doc})
    assert not off.tls_enabled and off.jwt is None and not off.authenticating
    off.check_files()


@pytest.mark.parametrize(
    "doc, needle",
    [
        ({"mode": "tls"}, "needs auth.tls"),
        ({"mode": "kerberos"}, "auth.mode"),
        ({"mode": "tlswithjwt", "tls": {"cert_file": "a", "key_file": "b"}}, "needs auth.jwt"),
        ({"jwt": {"secret_key": "short"}}, "at least 8"),
        ({"jwt": {"secret_key": SECRET, "algorithm": "none"}}, "unknown key"),
        ({"super_admins": "admin"}, "list"),
    ],
)
def test_bad_auth_blocks(doc, needle):
    with pytest.raises(InvalidArgumentError, match=needle):
        AuthSettings.from_dict(doc)


def test_world_readable_config_with_secrets_is_refused(tmp_path, caplog):
    path = tmp_path / "danube_broker.yml"
    path.write_text(f"auth:\n  mode: none\n  jwt:\n    secret_key: {SECRET}\n")
    os.chmod(path, 0o644)
    with pytest.raises(InvalidArgumentError, match="readable by every user"):
        BrokerConfig.from_yaml(str(path))
    assert str(path) in caplog.text and SECRET not in caplog.text
    os.chmod(path, 0o640)
    assert BrokerConfig.from_yaml(str(path)).auth.jwt is None  # read, and mode none leaves it off
    plain = tmp_path / "plain.yml"
    plain.write_text("sync: never\n")
    os.chmod(plain, 0o644)
    BrokerConfig.from_yaml(str(plain))  # no secrets: world-readable is fine


def test_world_readable_private_key_and_secret_file_are_refused(tmp_path):
    pki = _pki(tmp_path)
    os.chmod(pki.server.key, 0o644)
    with pytest.raises(InvalidArgumentError, match="TLS private key"):
        with_flags(AuthSettings(), tls_cert=pki.server.cert, tls_key=pki.server.key).check_files()
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    os.chmod(secret, 0o604)
    with pytest.raises(InvalidArgumentError, match="JWT secret file"):
        with_flags(AuthSettings(), jwt_secret_file=str(secret))
    os.chmod(secret, 0o600)
    assert with_flags(AuthSettings(), jwt_secret_file=str(secret)).jwt.secret_key == SECRET


def test_cli_tokens_create_signs_a_verifiable_token(tmp_path, capsys):
    from danube.cli.admin import main as admin_main

    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    assert (
        admin_main(
            [
                "security",
                "tokens",
                "create",
                "--subject",
                "alice",
                "--secret-key-file",
                str(secret),
                "--expires-in",
                "2h",
            ]
        )
        == 0
    )
    token = capsys.readouterr().out.strip()
    assert TokenVerifier(SECRET, issuer="danube-auth").subject(token) == "alice"
    assert admin_main(["security", "tokens", "create", "--subject", "bob", "--secret-key", SECRET]) == 0
    assert TokenVerifier(SECRET, issuer="danube-auth").subject(capsys.readouterr().out.strip()) == "bob"
