"""TLS for both gRPC servers and for the project's client.

* :func:`server_ssl_context` — Python ``ssl`` for danube's own HTTP/2 server (given to the event
  loop's ``create_server(ssl=...)``): TLS 1.2 or newer, ALPN ``h2`` only, the cipher suites HTTP/2
  allows (RFC 9113 §9.2: ephemeral key exchange, AEAD), no TLS compression or renegotiation, and,
  for mTLS, a client certificate required and verified against the CA file.
* :func:`server_credentials` — the same settings as grpc's own ``ssl_server_credentials`` for the
  grpc.aio servers (admin port, ``--grpc-server grpcio``).
* :func:`channel_credentials` — grpc channel credentials for a client (CA, optional cert + key).
* :func:`identity_of` — the common name of a verified peer certificate, from either server.
"""

from __future__ import annotations

import ssl
from typing import Any

from danube.errors import InvalidArgumentError
from danube.tlsfiles import read_tls_file as _read

# RFC 9113 §9.2.2: TLS 1.2 deployments of HTTP/2 use ephemeral key exchange and AEAD ciphers.
H2_TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20"
ALPN_H2 = "h2"


def server_ssl_context(
    cert_file: str, key_file: str, *, ca_file: str | None = None, verify_client: bool = False
) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    ctx.set_ciphers(H2_TLS12_CIPHERS)
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgumentError(f"cannot load the TLS certificate {cert_file} with key {key_file}: {exc}") from exc
    ctx.set_alpn_protocols([ALPN_H2])
    if ca_file:
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidArgumentError(f"cannot load the TLS CA file {ca_file}: {exc}") from exc
    if verify_client:
        if not ca_file:
            raise InvalidArgumentError("verifying client certificates needs a CA file")
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_ssl_context(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """A client context (tests and tools speaking HTTP/2 over TLS directly): ALPN h2, hostname checked."""
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols([ALPN_H2])
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def server_credentials(cert_file: str, key_file: str, *, ca_file: str | None = None, verify_client: bool = False):
    import grpc

    cert, key = _read(cert_file, "TLS certificate"), _read(key_file, "TLS private key")
    ca = _read(ca_file, "TLS CA file") if ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=bool(verify_client and ca)
    )


def channel_credentials(ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None):
    import grpc

    if (cert_file is None) != (key_file is None):
        raise InvalidArgumentError("a client certificate needs both the certificate and its private key")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file, "TLS CA file") if ca_file else None,
        private_key=_read(key_file, "TLS private key") if key_file else None,
        certificate_chain=_read(cert_file, "TLS certificate") if cert_file else None,
    )


def identity_of(cert: Any) -> str | None:
    """The subject common name of a verified peer certificate: Python's ``getpeercert()`` dict
    or grpc's ``auth_context()`` (``x509_common_name``); None without one."""
    if not cert:
        return None
    if "x509_common_name" in cert:
        names = cert.get("x509_common_name") or ()
        return names[0].decode() if names and isinstance(names[0], bytes) else (names[0] if names else None)
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None
