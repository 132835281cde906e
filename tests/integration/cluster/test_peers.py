"""danube.cluster.peers against real grpc.aio servers on loopback: which token a peer call
carries, the broker's certificate under mTLS, the hint on a TLS failure; and the security
pieces it relies on (the broker principal, rbac_refresh_seconds, https URLs)."""

from __future__ import annotations

import contextlib
import types

import grpc
import jwt as pyjwt
import pytest

from danube.cluster import peers
from danube.errors import AuthenticationError, InvalidArgumentError
from danube.security import tls
from danube.security.jwt import TokenVerifier
from danube.security.rbac import BROKER_PRINCIPAL, CLUSTER
from danube.security.settings import AuthSettings, JwtSettings, TlsSettings, with_flags
from danube.server.auth.guard import CallGuard
from danube.server.auth.runtime import Security
from danube.server.config import BrokerConfig
from tests.support.certs import make_cluster_pki

SECRET = "peers-unit-secret-0123456789abcdef"
ECHO = "/test.Peer/Echo"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_cluster_pki(str(tmp_path_factory.mktemp("pki")))


def _raw(x):
    return x


@contextlib.asynccontextmanager
async def echo_server(credentials=None):
    """A server whose one method answers what the call arrived with: the caller's authorization
    header (as peers.caller_authorization reads it) and the client certificate's CN."""

    async def echo(request, context):
        names = (context.auth_context() or {}).get("x509_common_name") or [b""]
        return f"{peers.caller_authorization(context) or ''}|{names[0].decode()}".encode()

    async def echo_stream(request, context):
        yield await echo(request, context)

    async def echo_client_stream(requests, context):
        async for _ in requests:
            pass
        return await echo(b"", context)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "test.Peer",
                {
                    "Echo": grpc.unary_unary_rpc_method_handler(
                        echo, request_deserializer=_raw, response_serializer=_raw
                    ),
                    "EchoStream": grpc.unary_stream_rpc_method_handler(
                        echo_stream, request_deserializer=_raw, response_serializer=_raw
                    ),
                    "EchoClientStream": grpc.stream_unary_rpc_method_handler(
                        echo_client_stream, request_deserializer=_raw, response_serializer=_raw
                    ),
                },
            )
        ]
    )
    address = "127.0.0.1:0"
    port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    await server.start()
    try:
        yield port
    finally:
        await server.stop(None)


async def echo(channels: peers.Peers, url: str, caller: str | None = None) -> tuple[str, str]:
    async with channels.channel(url, caller=caller) as channel:
        reply = await channel.unary_unary(ECHO)(b"", timeout=10)
    authorization, _, cn = reply.decode().partition("|")
    return authorization, cn


def _jwt_settings(**kw) -> AuthSettings:
    return AuthSettings(mode="none", jwt=JwtSettings(SECRET, issuer="danube-auth"), **kw)


async def test_jwt_peer_calls_carry_the_brokers_token_or_the_callers():
    channels = peers.Peers(_jwt_settings(), broker_id="broker-7")
    async with echo_server() as port:
        url = f"http://127.0.0.1:{port}"
        own, _ = await echo(channels, url)
        assert own.startswith("Bearer ")
        verifier = TokenVerifier(SECRET, issuer="danube-auth")
        assert verifier.subject(own[7:]) == BROKER_PRINCIPAL
        claims = pyjwt.decode(own[7:], SECRET, algorithms=["HS256"], issuer="danube-auth")
        assert claims["broker_id"] == "broker-7" and claims["exp"] - claims["iat"] == peers.TOKEN_LIFETIME_S
        assert channels.runs_as_broker(None)
        # forwarding for a caller: exactly the caller's header, not the broker's
        assert (await echo(channels, url, caller="Bearer caller-token"))[0] == "Bearer caller-token"
        assert not channels.runs_as_broker("Bearer caller-token")
        # streaming calls carry it too
        async with channels.channel(url, caller="Bearer caller-token") as channel:
            replies = [r async for r in channel.unary_stream("/test.Peer/EchoStream")(b"", timeout=10)]
            streamed = await channel.stream_unary("/test.Peer/EchoClientStream")(iter([b"a", b"b"]), timeout=10)
        assert replies == [b"Bearer caller-token|"] and streamed == b"Bearer caller-token|"
        # no JWT configured: no header at all, and a caller's call would run as the broker
        plain = peers.Peers(AuthSettings())
        assert (await echo(plain, f"127.0.0.1:{port}", caller="Bearer caller-token"))[0] == ""
        assert plain.runs_as_broker("Bearer caller-token")


async def test_mtls_peer_channel_presents_the_brokers_certificate(pki):
    settings = AuthSettings(
        mode="tls", tls=TlsSettings(pki.broker.cert, pki.broker.key, pki.ca, True), jwt=JwtSettings(SECRET)
    )
    credentials = tls.server_credentials(pki.broker.cert, pki.broker.key, ca_file=pki.ca, verify_client=True)
    async with echo_server(credentials) as port:
        authorization, cn = await echo(peers.Peers(settings, broker_id="b1"), f"https://127.0.0.1:{port}")
        assert cn == "danube-node" and authorization.startswith("Bearer ")
        # TLS without client certificates: the peer is verified, nothing is presented
        one_way = AuthSettings(mode="tls", tls=TlsSettings(pki.broker.cert, pki.broker.key, pki.ca, False))
        server_only = tls.server_credentials(pki.broker.cert, pki.broker.key)
        async with echo_server(server_only) as port2:
            assert await echo(peers.Peers(one_way), f"https://127.0.0.1:{port2}") == ("", "")


async def test_a_peer_signed_by_another_ca_fails_with_what_to_configure(pki):
    settings = AuthSettings(mode="tls", tls=TlsSettings(pki.broker.cert, pki.broker.key, pki.other_ca, True))
    channels = peers.Peers(settings)
    credentials = tls.server_credentials(pki.broker.cert, pki.broker.key, ca_file=pki.ca, verify_client=True)
    async with echo_server(credentials) as port:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await echo(channels, f"https://127.0.0.1:{port}")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    explained = channels.explain(info.value, as_broker=True)
    assert "auth.tls.ca_file must be the CA that signed the brokers' certificates" in explained
    assert "clientAuth" in explained  # verify_client: the certificate is a client certificate too


async def test_a_broker_certificate_without_client_authentication_fails_with_what_to_configure(tmp_path):
    """make_pki's server certificate allows serverAuth only: the peer refuses it as a client
    certificate and just closes the connection; the message still says what to check."""
    from tests.support.certs import make_pki

    server_only = make_pki(str(tmp_path / "pki"))
    settings = AuthSettings(
        mode="tls", tls=TlsSettings(server_only.server.cert, server_only.server.key, server_only.ca, True)
    )
    channels = peers.Peers(settings)
    credentials = tls.server_credentials(
        server_only.server.cert, server_only.server.key, ca_file=server_only.ca, verify_client=True
    )
    async with echo_server(credentials) as port:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await echo(channels, f"https://127.0.0.1:{port}")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    explained = channels.explain(info.value, as_broker=True)
    assert "TLS handshake" in explained and "extended key usage clientAuth" in explained, explained


def test_a_client_certificate_cannot_claim_the_broker_principal():
    guard = CallGuard(verifier=None, authorizer=None, broker=None, accept_client_certificates=True)
    cert = {"subject": ((("commonName", BROKER_PRINCIPAL),),)}
    with pytest.raises(AuthenticationError, match="reserved"):
        guard.principal((), lambda: cert)
    assert guard.principal((), lambda: {"subject": ((("commonName", "client-1"),),)}) == "client-1"


def test_the_broker_principal_is_a_super_admin_only_where_jwt_is_on(pki):
    with_jwt = Security(_jwt_settings(), types.SimpleNamespace(broker_id="b1"), metadata=None)
    assert with_jwt.authorizer.allowed(BROKER_PRINCIPAL, "admin", CLUSTER)
    assert isinstance(with_jwt.broker.peers, peers.Peers) and with_jwt.broker.peers.uses_tokens
    mtls_only = AuthSettings(
        mode="tls", tls=TlsSettings(pki.broker.cert, pki.broker.key, pki.ca, True), super_admins=("ops",)
    )
    security = Security(mtls_only, types.SimpleNamespace(broker_id="b1"), metadata=None)
    assert not security.authorizer.allowed(BROKER_PRINCIPAL, "admin", CLUSTER)
    assert not security.broker.peers.uses_tokens


def test_certificate_subject_reads_the_common_name(pki, tmp_path):
    assert peers.certificate_subject(pki.broker.cert) == "danube-node"
    assert peers.certificate_subject(str(tmp_path / "missing.pem")) is None


def test_rbac_refresh_seconds():
    assert AuthSettings.from_dict({"mode": "none"}).rbac_refresh_seconds == 5.0
    settings = AuthSettings.from_dict({"mode": "none", "rbac_refresh_seconds": 60})
    assert settings.rbac_refresh_seconds == 60
    assert with_flags(settings, super_admins=["ops"]).rbac_refresh_seconds == 60
    for bad in (0, -1, "soon", True):
        with pytest.raises(InvalidArgumentError, match="rbac_refresh_seconds"):
            AuthSettings.from_dict({"rbac_refresh_seconds": bad})


def test_advertised_urls_say_https_when_tls_is_on():
    tls_on = AuthSettings(mode="tls", tls=TlsSettings("c.pem", "k.pem"))
    assert BrokerConfig(port=7000).broker_url == "http://127.0.0.1:7000"
    assert BrokerConfig(port=7000, auth=tls_on).broker_url == "https://127.0.0.1:7000"
    assert BrokerConfig(advertised_addr="http://b1.example:6650", auth=tls_on).broker_url == "https://b1.example:6650"
    assert peers.target_of("https://b1.example:6650/") == "b1.example:6650"
