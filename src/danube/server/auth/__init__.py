"""Security: TLS and mTLS on both ports, JWT authentication, RBAC (default-deny).

``settings`` (the ``auth`` config block), ``tls`` (SSL contexts and grpc credentials),
``jwt`` (verify/issue HS256 tokens, with a cache of verified tokens), ``rbac`` (roles,
bindings, the permission check), ``guard`` (the per-call hook both gRPC servers call),
``admin_service`` (``danube_admin.SecurityAdmin``).  docs/security.md describes it all.
"""

from danube.server.auth.settings import AuthSettings, JwtSettings, TlsSettings

__all__ = ["AuthSettings", "JwtSettings", "TlsSettings"]
