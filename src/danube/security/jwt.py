"""JWT (HS256) as Danube issues and checks them: ``sub``, ``iss``, ``iat``, ``exp``.

:class:`TokenVerifier` checks the signature with the configured secret, the issuer and the
expiry (``exp`` is required: a token that never expires is refused).  A verified token is
remembered until its expiry (a bounded cache keyed by the token itself), so a client
sending the same token on every call costs one dictionary lookup per call, not an HMAC
and a JSON parse.  Failures are never cached and always say why.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jwt as pyjwt

from danube.errors import AuthenticationError, InvalidArgumentError

ALGORITHM = "HS256"
CACHE_ENTRIES = 4096


def issue_token(
    subject: str,
    secret_key: str,
    *,
    issuer: str | None = "danube-auth",
    expires_in_s: float = 3600,
    now: float | None = None,
    extra: dict | None = None,
) -> str:
    if not subject:
        raise InvalidArgumentError("a token needs a subject")
    if expires_in_s <= 0:
        raise InvalidArgumentError("a token's lifetime must be positive")
    issued = int(time.time() if now is None else now)
    claims = {"sub": subject, "iat": issued, "exp": issued + int(expires_in_s)}
    if issuer:
        claims["iss"] = issuer
    if extra:
        claims.update(extra)
    return pyjwt.encode(claims, secret_key, algorithm=ALGORITHM)


def parse_duration(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``12h``, ``30d``, ``1y`` → seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
    text = str(text).strip().lower()
    try:
        if text and text[-1] in units:
            value = float(text[:-1]) * units[text[-1]]
        else:
            value = float(text)
    except ValueError:
        raise InvalidArgumentError(f"bad duration {text!r}: expected e.g. 3600, 90s, 15m, 12h, 30d, 1y") from None
    if value <= 0:
        raise InvalidArgumentError(f"bad duration {text!r}: must be positive")
    return int(value)


class TokenVerifier:
    def __init__(
        self,
        secret_key: str,
        *,
        issuer: str | None = None,
        leeway_s: float = 0.0,
        cache_entries: int = CACHE_ENTRIES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock`` is the wall clock expiry is judged by (tests move it instead of waiting)."""
        self._key = secret_key
        self._issuer = issuer
        self._leeway = leeway_s
        self._clock = clock
        self._cache: dict[str, tuple[str, float]] = {}  # token -> (subject, expiry)
        self._cache_entries = cache_entries
        self.verified = 0  # tokens checked cryptographically (cache misses), for tests and benchmarks

    def __repr__(self) -> str:  # never the key
        return f"TokenVerifier(issuer={self._issuer!r})"

    def subject(self, token: str) -> str:
        """The token's subject, or AuthenticationError saying what is wrong with it."""
        hit = self._cache.get(token)
        if hit is not None:
            if hit[1] > self._clock():
                return hit[0]
            del self._cache[token]
        subject, expiry = self._verify(token)
        cache = self._cache
        if len(cache) >= self._cache_entries:
            now = self._clock()
            for key in [k for k, (_, exp) in cache.items() if exp <= now]:
                del cache[key]
            if len(cache) >= self._cache_entries:
                cache.clear()
        cache[token] = (subject, expiry)
        return subject

    def _verify(self, token: str) -> tuple[str, float]:
        self.verified += 1
        try:
            # the options as a literal in the call: newer PyJWT types them as a TypedDict, 2.8 as a dict
            claims = pyjwt.decode(
                token,
                self._key,
                algorithms=[ALGORITHM],
                issuer=self._issuer,
                leeway=self._leeway,
                options={"require": ["exp", "sub"]},
            )
        except pyjwt.ExpiredSignatureError:
            raise _expired(_unverified_exp(token)) from None
        except pyjwt.InvalidSignatureError:
            raise AuthenticationError(
                "the token's signature does not verify: it was forged or signed with another secret key"
            ) from None
        except pyjwt.InvalidIssuerError:
            raise AuthenticationError(f"the token's issuer is not {self._issuer!r}") from None
        except pyjwt.MissingRequiredClaimError as exc:
            raise AuthenticationError(f"the token has no {exc.claim!r} claim") from None
        except pyjwt.InvalidAlgorithmError:
            raise AuthenticationError(f"the token is not signed with {ALGORITHM}") from None
        except pyjwt.ImmatureSignatureError:
            raise AuthenticationError("the token is not valid yet (iat/nbf in the future)") from None
        except pyjwt.InvalidTokenError as exc:
            raise AuthenticationError(f"the token is malformed: {exc}") from None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise AuthenticationError("the token's subject is empty")
        expiry = float(claims["exp"]) + self._leeway
        if expiry <= self._clock():  # pyjwt judged by the system clock; an injected one may be later
            raise _expired(float(claims["exp"]))
        return subject, expiry


def _expired(exp: float | None) -> AuthenticationError:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exp)) if exp else "an earlier time"
    return AuthenticationError(f"the token expired at {when}; get a new one (danube admin security tokens create)")


def _unverified_exp(token: str) -> float | None:
    try:
        exp = pyjwt.decode(token, options={"verify_signature": False}).get("exp")
        return float(exp) if exp is not None else None
    except Exception:  # noqa: BLE001 - only for the message
        return None
