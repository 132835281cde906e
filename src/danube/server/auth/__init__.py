"""Security at the server edge: TLS and mTLS on both ports, JWT authentication, RBAC (default-deny).

``guard`` (the per-call hook both gRPC servers call), ``runtime`` (what a broker builds from its
``auth`` settings), ``admin_service`` (``danube_admin.SecurityAdmin``); the primitives they use
(settings, TLS, JWT, RBAC) are ``danube.security``.  docs/security.md describes it all.
"""

from danube.security.settings import AuthSettings, JwtSettings, TlsSettings

__all__ = ["AuthSettings", "JwtSettings", "TlsSettings"]
