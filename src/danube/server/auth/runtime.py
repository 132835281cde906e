"""``Security``: what the broker process builds from its ``auth`` settings and hands its servers.

``BrokerApp`` asks it to guard the client port's server (every handler registered through
:class:`~danube.server.auth.guard.GuardedRegistrar`), for the admin server's interceptors,
to bind ports (TLS or not) and to register ``danube_admin.SecurityAdmin``.  It also gives the
broker its :class:`~danube.cluster.peers.Peers` (``broker.peers``): the channels brokers of a
cluster call each other on, secured by the same settings.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, cast

from danube.security.rbac import BROKER_PRINCIPAL, CLUSTER, Authorizer
from danube.security.settings import AuthSettings, TlsSettings
from danube.server.auth.guard import CallGuard, GuardedRegistrar, GuardInterceptor, _grpc_auth_context

if TYPE_CHECKING:
    from danube.broker.service import BrokerService

log = logging.getLogger(__name__)


class Security:
    def __init__(self, settings: AuthSettings, broker: BrokerService, metadata) -> None:
        self.settings = settings
        self.broker = broker
        settings.check_files()
        super_admins = tuple(settings.super_admins)
        if settings.jwt is not None:  # the brokers' own tokens (danube.cluster.peers)
            super_admins += (BROKER_PRINCIPAL,)
        self.authorizer = Authorizer(
            metadata,
            super_admins=super_admins,
            refresh_s=settings.rbac_refresh_seconds if settings.authenticating else 0.0,
        )
        from danube.cluster.peers import Peers

        broker.peers = Peers(settings, broker_id=broker.broker_id)
        self.guard: CallGuard | None = None
        if settings.authenticating:
            verifier = None
            if settings.jwt is not None:
                from danube.security.jwt import TokenVerifier

                verifier = TokenVerifier(settings.jwt.secret_key, issuer=settings.jwt.issuer)
            self.guard = CallGuard(
                verifier=verifier, authorizer=self.authorizer, broker=broker, accept_client_certificates=settings.mtls
            )
        self._ssl_context = None
        self._grpc_credentials = None
        if settings.tls_enabled:
            from danube.security import tls

            t = cast(TlsSettings, settings.tls)  # set when tls_enabled
            self._ssl_context = tls.server_ssl_context(
                t.cert_file, t.key_file, ca_file=t.ca_file, verify_client=t.verify_client
            )
            self._grpc_credentials = tls.server_credentials(
                t.cert_file, t.key_file, ca_file=t.ca_file, verify_client=t.verify_client
            )

    async def start(self) -> None:
        await self.authorizer.start()
        log.info("security: %s", self.settings.describe())
        if self.broker.cluster is not None:
            self._check_cluster_identity()
        if self.settings.jwt is not None and not self.settings.tls_enabled:
            log.warning(
                "security: JWTs are accepted over plain text (auth.mode none): a token can be read off "
                "the network and replayed; set auth.mode tls with auth.tls"
            )

    def _check_cluster_identity(self) -> None:
        """What would make calls to other brokers fail, said at start-up rather than at the first
        refused drain: no CA to verify them; with mTLS and no JWT, a certificate CN (what brokers
        call each other as) that RBAC does not let administer the cluster."""
        from danube.cluster.peers import MTLS_BROKER_HINT, certificate_subject

        settings = self.settings
        tls = cast(TlsSettings, settings.tls)  # read below only when TLS is on (mTLS is TLS)
        if settings.tls_enabled and not tls.ca_file:
            log.warning(
                "security: auth.tls.ca_file is not set, so this broker verifies the other brokers' "
                "certificates against the system's CAs only; set it to the CA that signed them"
            )
        if not settings.mtls or settings.jwt is not None:
            return
        subject = certificate_subject(tls.cert_file)
        if subject is None:
            log.warning("security: cannot read the common name of %s; %s", tls.cert_file, MTLS_BROKER_HINT)
        elif not self.authorizer.allowed(subject, "admin", CLUSTER):
            log.warning(
                "security: this broker's certificate subject %r may not administer the cluster, so other "
                "brokers will refuse its calls (forwarded admin requests, unloads, drains) with "
                "PERMISSION_DENIED; %s",
                subject,
                MTLS_BROKER_HINT,
            )

    async def stop(self) -> None:
        await self.authorizer.stop()

    # ------------------------------------------------------------ servers

    def guard_client_server(self, server):
        """The server to register the client port's services on (the guard in front when on)."""
        if self.guard is None:
            return server
        if hasattr(server, "peer_certificate"):  # danube's own HTTP/2 server

            def cert_lookup(context):
                return server.peer_certificate(context.peer())
        else:
            cert_lookup = _grpc_auth_context
        return GuardedRegistrar(server, self.guard, cert_lookup)

    def interceptors(self) -> list:
        return [GuardInterceptor(self.guard)] if self.guard is not None else []

    def add_port(self, server, address: str) -> int:
        if not self.settings.tls_enabled:
            return server.add_insecure_port(address)
        if hasattr(server, "peer_certificate"):
            return server.add_secure_port(address, self._ssl_context)
        return server.add_secure_port(address, self._grpc_credentials)

    def add_admin_services(self, server) -> None:
        from danube.server.auth import admin_service

        admin_service.add_to_server(server, self.authorizer)
