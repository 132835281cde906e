"""Reading the certificate, key and CA files of TLS settings: one helper for the client
(``danube.client.security``) and the servers (``danube.security.tls``).  It imports only the
error table, so the client may use it without loading anything of the server side."""

from __future__ import annotations

from danube.errors import InvalidArgumentError


def read_tls_file(path: str, what: str) -> bytes:
    """The file's bytes; InvalidArgumentError naming ``what`` and the path when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {what} {path}: {exc.strerror}") from exc
