"""Calls from this broker to another broker of the cluster, secured as this broker's ``auth``
settings secure its own ports (docs/security.md, "Cluster").

Brokers call each other's admin port (an admin request forwarded to a topic's owner or to the
leader, a topic unload, a drain) and client port (scalable-topic calls forwarded to a controller
leader or to a segment's broker).  :class:`Peers` opens those channels:

* **TLS** (``auth.mode tls``): verified against ``auth.tls.ca_file`` (the CA that signed the
  brokers' certificates; without one, the system's CAs), the host name of the peer's registered
  URL checked against its certificate;
* **mTLS** (``verify_client``): this broker's own certificate and key presented as the client
  certificate (so the brokers' certificates must allow client authentication too);
* **JWT**: an ``authorization`` header on every call (see below).

Which principal a peer call runs as:

* an admin request forwarded **on behalf of a caller** who sent a bearer token carries that
  token: the owner verifies it itself and RBAC there judges the same principal, so forwarding
  never lends the caller the broker's rights;
* everything else runs as **the broker itself**: the broker's own work (segment statistics,
  terminations), and a caller authenticated by its client certificate (a certificate cannot be
  forwarded; the broker that took the call checked the caller's permission for the same request
  against the same roles, which every broker reads from the metadata store).  With JWT the
  broker mints a short-lived token for :data:`BROKER_PRINCIPAL` with the cluster's shared secret;
  RBAC treats that principal as a super admin (a holder of the secret can mint any token anyway),
  and no client certificate may claim the name.  With mTLS and no JWT the broker is its
  certificate's common name, which the operator lists in ``auth.super_admins`` of every broker
  (the broker's start-up log says when RBAC would refuse it).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

import grpc

from danube.security.rbac import BROKER_PRINCIPAL
from danube.security.settings import AuthSettings

if TYPE_CHECKING:
    from danube.broker.contracts import PeerChannels
    from danube.broker.service import BrokerService

log = logging.getLogger(__name__)

# Long enough to cover one forwarded call, short enough that a token read off a peer's log or
# memory is soon useless; renewed a minute before it ends so a call never leaves with a stale one.
TOKEN_LIFETIME_S = 300
TOKEN_RENEW_BEFORE_S = 60
_BEARER = "bearer "


def target_of(url: str) -> str:
    """``https://host:port`` (or ``http://``, or bare ``host:port``) → ``host:port`` for grpc."""
    return str(url).split("://", 1)[-1].rstrip("/")


def caller_authorization(context: Any) -> str | None:
    """The ``authorization: Bearer ...`` value the caller of a served call sent, if any."""
    try:
        metadata = context.invocation_metadata() or ()
    except Exception:  # noqa: BLE001 - a context without metadata: no caller token
        return None
    for key, value in metadata:
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            return text if text[: len(_BEARER)].lower() == _BEARER else None
    return None


class _Header:
    """Adds ``authorization`` to every call of a peer channel, read when the call starts (a cached
    channel then never sends an expired broker token)."""

    def __init__(self, header: Callable[[], str | None]) -> None:
        self._header = header

    def _details(self, client_call_details):
        value = self._header()
        if value is None:
            return client_call_details
        pairs = [(k, v) for k, v in (client_call_details.metadata or ()) if k != "authorization"]
        pairs.append(("authorization", value))
        return client_call_details._replace(metadata=grpc.aio.Metadata(*pairs))


# grpc.aio files each interceptor under the first call kind it implements, so one class per kind.
class _UnaryUnary(_Header, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _UnaryStream(_Header, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _StreamUnary(_Header, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


class _StreamStream(_Header, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


def _authorizing(header: Callable[[], str | None]) -> list:
    return [kind(header) for kind in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]


class Peers:
    """Channels to other brokers as this broker's :class:`AuthSettings` require; one per broker
    (``broker.peers``, set by ``danube.server.auth.runtime.Security``)."""

    def __init__(self, settings: AuthSettings | None = None, *, broker_id: str = "") -> None:
        self.settings = settings or AuthSettings()
        self.broker_id = str(broker_id)
        self._credentials = None
        self._token: tuple[str, float] | None = None  # (header value, unix time it ends)

    def __repr__(self) -> str:  # never a token or the secret
        return f"Peers(broker_id={self.broker_id!r}, {self.settings.describe()})"

    # ------------------------------------------------------------ who

    @property
    def uses_tokens(self) -> bool:
        return self.settings.jwt is not None

    def own_authorization(self) -> str | None:
        """``Bearer <jwt>`` of :data:`BROKER_PRINCIPAL` (None without JWT), renewed before it ends."""
        jwt = self.settings.jwt
        if jwt is None:
            return None
        now = time.time()
        if self._token is None or self._token[1] - now < TOKEN_RENEW_BEFORE_S:
            from danube.security.jwt import issue_token

            token = issue_token(
                BROKER_PRINCIPAL,
                jwt.secret_key,
                issuer=jwt.issuer,
                expires_in_s=TOKEN_LIFETIME_S,
                now=now,
                extra={"broker_id": self.broker_id} if self.broker_id else None,
            )
            self._token = (f"Bearer {token}", now + TOKEN_LIFETIME_S)
        return self._token[0]

    def runs_as_broker(self, caller: str | None) -> bool:
        """Whether a peer call forwarded for ``caller`` runs as this broker rather than as the caller:
        without a caller token, or without JWT (a client certificate cannot be forwarded)."""
        return caller is None or not self.uses_tokens

    # ------------------------------------------------------------ channels

    def channel(self, url: str, *, caller: str | None = None) -> grpc.aio.Channel:
        """A channel to a peer's ``url`` (admin or client port).  ``caller``: the authorization
        header of the call being forwarded (:func:`caller_authorization`), None for the broker's
        own calls."""
        target = target_of(url)
        interceptors = []
        if self.uses_tokens:
            interceptors = _authorizing(self.own_authorization if self.runs_as_broker(caller) else lambda: caller)
        if not self.settings.tls_enabled:
            return grpc.aio.insecure_channel(target, interceptors=interceptors or None)
        return grpc.aio.secure_channel(target, self._channel_credentials(), interceptors=interceptors or None)

    def _channel_credentials(self):
        if self._credentials is None:
            from danube.security import tls

            t = self.settings.tls
            assert t is not None, "channel credentials are built only when settings.tls_enabled"
            if t.verify_client:
                self._credentials = tls.channel_credentials(t.ca_file, t.cert_file, t.key_file)
            else:
                self._credentials = tls.channel_credentials(t.ca_file)
        return self._credentials

    # ------------------------------------------------------------ errors

    def explain(self, exc: grpc.aio.AioRpcError, *, as_broker: bool) -> str:
        """The peer's error message, with what to configure when the cause is this cluster's security
        setup rather than the request (``as_broker``: the call ran as the broker itself)."""
        details = exc.details() or ""
        code = exc.code()
        hint = ""
        tls_failure = (
            _tls_failure(details) if code == grpc.StatusCode.UNAVAILABLE and self.settings.tls_enabled else None
        )
        if tls_failure is not None:
            hint = (
                f"; {tls_failure}: auth.tls.ca_file must be the CA that signed the brokers' certificates, "
                "each certificate must name the host of its broker's advertised URL"
            )
            if self.settings.mtls:
                hint += (
                    ", and with verify_client the brokers' certificates are also presented as client "
                    "certificates (extended key usage clientAuth as well as serverAuth)"
                )
        elif as_broker and code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            if self.uses_tokens:
                hint = (
                    "; the peer refused this broker's own token: every broker of a cluster needs the same "
                    "auth.jwt secret_key and issuer"
                )
            elif self.settings.mtls:
                hint = "; " + MTLS_BROKER_HINT
        return f"{details}{hint}"


MTLS_BROKER_HINT = (
    "with mTLS and no JWT, brokers call each other as their certificate's common name: list the "
    "brokers' certificate subjects (CN) in auth.super_admins of every broker, or configure auth.jwt "
    "(the same secret on every broker) so they use broker tokens"
)


def _tls_failure(details: str) -> str | None:
    """What an UNAVAILABLE on a TLS channel says about the handshake, if anything.  A peer that
    refuses this broker's client certificate just closes the connection, so the client side only
    sees "Socket closed"."""
    text = details.lower()
    if any(word in text for word in ("ssl", "tls", "handshake", "certificate")):
        return "the TLS handshake with the peer broker failed"
    if "socket closed" in text or "connection reset" in text:
        return "the peer broker closed the connection (if it is running, the TLS handshake failed)"
    return None


def for_broker(broker: BrokerService) -> PeerChannels:
    """The broker's :class:`Peers` (plain text, no token, when security was never configured)."""
    if broker.peers is None:
        broker.peers = Peers(broker_id=broker.broker_id)
    return broker.peers


def certificate_subject(cert_file: str) -> str | None:
    """The common name of a PEM certificate file (None when it cannot be read)."""
    import ssl

    try:
        # the standard library's only certificate parser; it is what ssl's own tests use
        decoded = ssl._ssl._test_decode_cert(cert_file)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - only for a start-up check
        return None
    for rdn in decoded.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None


__all__ = ["BROKER_PRINCIPAL", "Peers", "caller_authorization", "certificate_subject", "for_broker", "target_of"]
