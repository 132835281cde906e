"""``AuthSettings``: Danube's ``auth`` block of the broker config, checked once at start.

::

    auth:
      mode: tls                  # none (default: no security, the rest is not used) | tls
                                 # (Danube's "tlswithjwt" = tls, and a jwt section is required)
      tls:
        cert_file: ./cert/server-cert.pem
        key_file: ./cert/server-key.pem       # refused when anyone may read it (as OpenSSH does)
        ca_file: ./cert/ca-cert.pem           # verifies client certificates
        verify_client: false                  # true = mTLS: a client certificate signed by ca_file
      jwt:                                    # present = every call needs "authorization: Bearer <jwt>"
        secret_key: "..."                     # HS256 key (or secret_key_file: a file holding it)
        issuer: danube-auth
        expiration_time: 3600                 # Danube's default token lifetime (read; a token's exp decides)
      super_admins: [admin]                   # JWT subjects (or client-certificate CNs) that bypass RBAC
      rbac_refresh_seconds: 5                 # how often roles and bindings changed elsewhere are re-read

The secret is kept out of ``repr`` so it never reaches a log line.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Mapping

from danube.errors import InvalidArgumentError
from danube.settings import ConfigError, check_settings, load_section, setting

log = logging.getLogger(__name__)

AUTH_MODES = ("none", "tls")
_MODE_ALIASES = {"tlswithjwt": "tls", "tls_with_jwt": "tls", "": "none"}


def refuse_if_world_readable(path: str, what: str) -> None:
    """OpenSSH's rule for files holding secrets: anyone-may-read is refused, naming the file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {what} {path}: {exc.strerror}") from exc
    if mode & stat.S_IROTH:
        log.warning(
            "UNPROTECTED FILE: %s %s is readable by every user (mode %04o); it holds secrets, so it "
            "is refused. Run: chmod o-rwx %s",
            what,
            path,
            stat.S_IMODE(mode),
            path,
        )
        raise InvalidArgumentError(
            f"{what} {path} holds secrets and is readable by every user (mode {stat.S_IMODE(mode):04o}); "
            f"refusing to use it: chmod o-rwx {path}"
        )


@dataclass(frozen=True)
class TlsSettings:
    cert_file: str
    key_file: str
    ca_file: str | None = None
    verify_client: bool = False

    def __post_init__(self) -> None:
        check_settings(self)

    def check(self) -> None:
        for what, path in (("TLS certificate", self.cert_file), ("TLS CA file", self.ca_file)):
            if path is not None and not os.path.isfile(path):
                raise InvalidArgumentError(f"auth.tls: {what} {path} does not exist")
        if not os.path.isfile(self.key_file):
            raise InvalidArgumentError(f"auth.tls: TLS private key {self.key_file} does not exist")
        refuse_if_world_readable(self.key_file, "TLS private key")
        if self.verify_client and not self.ca_file:
            raise InvalidArgumentError(
                "auth.tls.verify_client needs auth.tls.ca_file (the CA that signs client certificates)"
            )


@dataclass(frozen=True)
class JwtSettings:
    secret_key: str = field(repr=False)
    issuer: str | None = "danube-auth"
    expiration_time: int = setting(3600, minimum=1)  # seconds

    def __post_init__(self) -> None:
        if not isinstance(self.secret_key, str) or len(self.secret_key) < 8:  # never quoted: it is a secret
            raise ConfigError("secret_key", "must be a string of at least 8 characters")
        check_settings(self)


@dataclass(frozen=True)
class AuthSettings:
    mode: str = setting("none", choices=AUTH_MODES)
    tls: TlsSettings | None = None
    jwt: JwtSettings | None = None
    super_admins: tuple[str, ...] = ()  # JWT subjects or client-certificate CNs
    rbac_refresh_seconds: float = setting(5.0, above=0)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.mode == "tls" and self.tls is None:
            raise ConfigError("mode", "tls needs auth.tls.cert_file and auth.tls.key_file")

    @property
    def tls_enabled(self) -> bool:
        return self.mode == "tls" and self.tls is not None

    @property
    def mtls(self) -> bool:
        return self.tls_enabled and self.tls is not None and self.tls.verify_client

    @property
    def authenticating(self) -> bool:
        """Every call must carry an identity (a JWT, or a verified client certificate); RBAC applies."""
        return self.jwt is not None or self.mtls

    def describe(self) -> str:
        """For the start-up log: what is on, never a secret."""
        parts = [f"mode {self.mode}"]
        if self.tls_enabled:
            parts.append("mTLS (client certificates verified)" if self.mtls else "TLS")
        if self.jwt is not None:
            parts.append(f"JWT HS256 (issuer {self.jwt.issuer or 'any'})")
        if self.authenticating:
            parts.append(f"RBAC default-deny, {len(self.super_admins)} super admin(s)")
        else:
            parts.append("no authentication")
        return ", ".join(parts)

    def check_files(self) -> None:
        if self.tls_enabled and self.tls is not None:
            self.tls.check()

    @classmethod
    def from_dict(cls, data: Any, *, base_dir: str | None = None, path: str = "auth") -> "AuthSettings":
        """The ``auth`` block, through the one settings loader; relative paths against ``base_dir``."""
        return load_section(cls, data, path, base_dir=base_dir)

    @classmethod
    def parse_section(
        cls, data: Mapping[str, Any], where: str = "auth", *, base_dir: str | None = None
    ) -> "AuthSettings":
        """The loader's hook: Danube's mode names, files resolved, a secret read from its file."""
        data = dict(data)
        raw_mode = str(data.pop("mode", "none") or "none").strip().lower()
        mode = _MODE_ALIASES.get(raw_mode, raw_mode)
        requires_jwt = raw_mode in ("tlswithjwt", "tls_with_jwt")

        def path(value: Any) -> str | None:
            if value in (None, ""):
                return None
            text = os.path.expanduser(str(value))
            return text if os.path.isabs(text) or base_dir is None else os.path.join(base_dir, text)

        tls = None
        tls_doc = data.pop("tls", None)
        if tls_doc:
            if not isinstance(tls_doc, Mapping):
                raise InvalidArgumentError("auth.tls: expected a mapping")
            tls_doc = dict(tls_doc)
            cert, key = path(tls_doc.pop("cert_file", None)), path(tls_doc.pop("key_file", None))
            ca = path(tls_doc.pop("ca_file", None))
            verify = tls_doc.pop("verify_client", False)
            if not isinstance(verify, bool):
                raise InvalidArgumentError(f"auth.tls.verify_client must be true or false, got {verify!r}")
            _no_more(tls_doc, "auth.tls")
            if cert is None or key is None:
                raise InvalidArgumentError("auth.tls needs cert_file and key_file")
            try:
                tls = TlsSettings(cert, key, ca, verify)
            except ConfigError as exc:
                raise exc.under(f"{where}.tls") from None
        jwt = None
        jwt_doc = data.pop("jwt", None)
        if jwt_doc:
            if not isinstance(jwt_doc, Mapping):
                raise InvalidArgumentError("auth.jwt: expected a mapping")
            jwt_doc = dict(jwt_doc)
            secret = jwt_doc.pop("secret_key", None)
            secret_file = path(jwt_doc.pop("secret_key_file", None))
            if secret_file is not None:
                if secret is not None:
                    raise InvalidArgumentError("auth.jwt: give secret_key or secret_key_file, not both")
                secret = read_secret_file(secret_file)
            if secret is None:
                raise InvalidArgumentError("auth.jwt needs secret_key (or secret_key_file)")
            issuer = jwt_doc.pop("issuer", "danube-auth")
            expiration = jwt_doc.pop("expiration_time", 3600)
            _no_more(jwt_doc, "auth.jwt")
            try:
                jwt = JwtSettings(str(secret), None if issuer in (None, "") else str(issuer), expiration)
            except ConfigError as exc:
                raise exc.under(f"{where}.jwt") from None
        admins = data.pop("super_admins", None) or ()
        if isinstance(admins, str) or not all(isinstance(a, str) and a for a in admins):
            raise InvalidArgumentError("auth.super_admins must be a list of subject names")
        refresh = data.pop("rbac_refresh_seconds", 5.0)
        _no_more(data, "auth")
        if mode == "none" and (tls is not None or jwt is not None):
            # Danube's mode none means no security at all, whatever else the block holds.
            log.info("auth.mode is none: the auth.tls and auth.jwt settings are not used")
            tls = jwt = None
        if requires_jwt and jwt is None:
            raise InvalidArgumentError(f"auth.mode {raw_mode} needs auth.jwt (secret_key, issuer)")
        try:
            return cls(mode=mode, tls=tls, jwt=jwt, super_admins=tuple(admins), rbac_refresh_seconds=refresh)
        except ConfigError as exc:
            raise exc.under(where) from None


def read_secret_file(path: str) -> str:
    refuse_if_world_readable(path, "JWT secret file")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read JWT secret file {path}: {exc.strerror}") from exc


def _no_more(doc: Mapping, where: str) -> None:
    if doc:
        raise ConfigError(f"unknown key {where}.{sorted(map(str, doc))[0]}", "not a setting (docs/security.md)")


def with_flags(
    settings: AuthSettings,
    *,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
    tls_verify_client: bool | None = None,
    jwt_secret_file: str | None = None,
    jwt_issuer: str | None = None,
    super_admins: list[str] | None = None,
) -> AuthSettings:
    """``danube broker`` flags on top of the file's ``auth`` block (a flag given wins).  The JWT
    secret is only taken from a file: a secret on the command line shows in ``ps``."""
    from dataclasses import replace

    tls = settings.tls
    if tls_cert or tls_key or tls_ca or tls_verify_client:
        cert = tls_cert or (tls.cert_file if tls else None)
        key = tls_key or (tls.key_file if tls else None)
        if not cert or not key:
            raise InvalidArgumentError("TLS needs both --tls-cert and --tls-key (or auth.tls in the config file)")
        tls = TlsSettings(
            cert,
            key,
            tls_ca or (tls.ca_file if tls else None),
            bool(tls_verify_client) or (tls.verify_client if tls else False),
        )
    jwt = settings.jwt
    if jwt_secret_file:
        jwt = JwtSettings(
            read_secret_file(jwt_secret_file),
            jwt_issuer or (jwt.issuer if jwt else "danube-auth"),
            jwt.expiration_time if jwt else 3600,
        )
    elif jwt_issuer and jwt is not None:
        jwt = replace(jwt, issuer=jwt_issuer)
    mode = "tls" if tls is not None and (tls is not settings.tls or settings.mode == "tls") else settings.mode
    return AuthSettings(
        mode=mode,
        tls=tls,
        jwt=jwt,
        super_admins=tuple(super_admins) if super_admins else settings.super_admins,
        rbac_refresh_seconds=settings.rbac_refresh_seconds,
    )
