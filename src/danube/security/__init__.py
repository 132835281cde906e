"""Security primitives, below the server and the cluster that both use them: ``settings`` (the
``auth`` config block), ``tls`` (SSL contexts and grpc credentials), ``jwt`` (verify/issue HS256
tokens, with a cache of verified tokens), ``rbac`` (roles, bindings, the permission check).  The
server's per-call hook and admin service are in ``danube.server.auth``; docs/security.md describes
it all.
"""

from danube.security.settings import AuthSettings, JwtSettings, TlsSettings

__all__ = ["AuthSettings", "JwtSettings", "TlsSettings"]
