"""TLS, mTLS and JWT for ``danube.client``, as ``danube-client`` 0.5.0 offers them.

``DanubeClient.builder().with_tls(ca)``, ``.with_mtls(ca, cert, key)``, ``.with_token(jwt)``
and ``.with_token_supplier(fn)`` fill a :class:`ClientSecurity`; every channel the client
opens then speaks TLS (HTTP/2 over TLS with ALPN ``h2``, the broker's name or IP checked
against its certificate) and every call carries ``authorization: Bearer <jwt>``.  As in
Danube's client, a token turns TLS on (with the system's CAs unless ``with_tls`` named
one): a bearer token must not cross the network in clear text.  A supplier is called for
every call, so a token refreshed by the application (a file rewritten, a new token minted
before the old one expires) is used from the next call on, and a long-lived stream keeps
the identity it was opened with.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Callable

import grpc

from danube.errors import InvalidArgumentError
from danube.tlsfiles import read_tls_file as _read


class _BearerToken(grpc.AuthMetadataPlugin):
    def __init__(self, supplier: Callable[[], str]) -> None:
        self._supplier = supplier

    def __call__(self, context, callback) -> None:
        try:
            token = self._supplier()
        except Exception as exc:  # noqa: BLE001 - the call fails with the supplier's error
            callback((), exc)
            return
        callback((("authorization", f"Bearer {token}"),) if token else (), None)


@dataclass
class ClientSecurity:
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    token_supplier: Callable[[], str] | None = None

    def __repr__(self) -> str:  # never the token
        return (
            f"ClientSecurity(ca_file={self.ca_file!r}, cert_file={self.cert_file!r}, "
            f"token={'set' if self.token or self.token_supplier else 'none'})"
        )

    def credentials(self) -> grpc.ChannelCredentials:
        ssl = grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "CA file") if self.ca_file else None,
            private_key=_read(self.key_file, "client key") if self.key_file else None,
            certificate_chain=_read(self.cert_file, "client certificate") if self.cert_file else None,
        )
        supplier = self.token_supplier
        if supplier is None and self.token:
            token = self.token
            supplier = lambda: token  # noqa: E731
        if supplier is None:
            return ssl
        return grpc.composite_channel_credentials(
            ssl, grpc.metadata_call_credentials(_BearerToken(supplier), name="danube-jwt")
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The same TLS for the client's own HTTP/2 transport (``danube.client.h2``): the CA (or
        the system's), the client certificate for mTLS, ALPN ``h2``, the server's name checked."""
        context = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else ssl.create_default_context()
        if self.cert_file and self.key_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        context.set_alpn_protocols(["h2"])
        return context

    def bearer(self) -> str | None:
        """The token for a new call (the supplier is asked each time), or None."""
        if self.token_supplier is not None:
            return self.token_supplier()
        return self.token

    def channel(self, address: str, options) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(address, self.credentials(), options=options)


def with_tls(security: ClientSecurity | None, ca_file: str) -> ClientSecurity:
    security = security or ClientSecurity()
    _read(ca_file, "CA file")
    security.ca_file = ca_file
    return security


def with_mtls(security: ClientSecurity | None, ca_file: str, cert_file: str, key_file: str) -> ClientSecurity:
    security = with_tls(security, ca_file)
    _read(cert_file, "client certificate")
    _read(key_file, "client key")
    security.cert_file, security.key_file = cert_file, key_file
    return security


def with_token(security: ClientSecurity | None, token: str) -> ClientSecurity:
    if not token or not isinstance(token, str):
        raise InvalidArgumentError("with_token needs a JWT (danube admin security tokens create)")
    security = security or ClientSecurity()
    security.token, security.token_supplier = token, None
    return security


def with_token_supplier(security: ClientSecurity | None, supplier: Callable[[], str]) -> ClientSecurity:
    if not callable(supplier):
        raise InvalidArgumentError("with_token_supplier needs a function returning the current JWT")
    security = security or ClientSecurity()
    security.token_supplier, security.token = supplier, None
    return security
