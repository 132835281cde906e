"""Role-based access control, default-deny.

A **role** is a name and a list of grants ``permission:pattern``; a **binding** gives a
subject (a JWT ``sub``, or a client certificate's common name) one or more roles.  Both live
in the metadata store (``/security/roles/<role>``, ``/security/bindings/<subject>``, JSON),
so every broker of a cluster reads the same ones.

Permissions: ``produce``, ``consume``, ``lookup``, ``admin``.  Patterns are globs over
resources: a topic ``/ns/topic`` (a grant on a partitioned topic ``T`` covers its partitions
``T-part-i``, on a scalable topic its segment topics ``T.seg.<range>-<id>``), a namespace ``/ns`` (matched by ``/ns``, ``/ns/*`` or ``*``), and the cluster
``*`` (matched by ``*`` only).  Nothing is allowed unless a grant says so; the configured
``super_admins`` are allowed everything.

Decisions are cached per (subject, permission, resource) and the cache is dropped whenever
the roles or bindings change (an admin call here, or the periodic re-read that picks up
changes made through another broker).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Iterable

from danube.errors import InvalidArgumentError, NotFoundError, PermissionDeniedError
from danube.metadata import keys

log = logging.getLogger(__name__)

PERMISSIONS = ("produce", "consume", "lookup", "admin")
CLUSTER = "*"
ANY_RESOURCE = None  # "holds the permission on some resource" (schema registry reads, ...)
_PARTITION = re.compile(r"^(.*)-part-\d+$")
# a scalable topic's segment topic (danube.model.segment_layout.segment_topic_name)
_SEGMENT = re.compile(r"^(.*)\.seg\.[0-9a-f]{4}-[0-9a-f]{4}-\d+$")
_ROLE_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
_DECISIONS_MAX = 65536
# The principal brokers call each other as when JWT is on (danube.cluster.peers): its tokens are
# minted with the cluster's shared secret, so it is a super admin wherever JWT is configured, and
# the guard never takes it from a client certificate.
BROKER_PRINCIPAL = "danube-broker"


@dataclass(frozen=True)
class Grant:
    permission: str
    pattern: str

    @classmethod
    def parse(cls, text: str) -> "Grant":
        """``produce:/default/*`` → Grant."""
        permission, sep, pattern = str(text).partition(":")
        permission = permission.strip().lower()
        if not sep or permission not in PERMISSIONS or not pattern.strip():
            raise InvalidArgumentError(
                f"bad grant {text!r}: expected PERMISSION:PATTERN with PERMISSION one of "
                f"{', '.join(PERMISSIONS)} (e.g. produce:/default/*)"
            )
        pattern = pattern.strip()
        if pattern != CLUSTER and not pattern.startswith("/"):
            raise InvalidArgumentError(f"bad grant {text!r}: the pattern is '*' or starts with '/'")
        return cls(permission, pattern)

    def __str__(self) -> str:
        return f"{self.permission}:{self.pattern}"

    def covers(self, permission: str, resource: str | None) -> bool:
        if permission != self.permission:
            return False
        pattern = self.pattern
        if resource is ANY_RESOURCE or pattern == CLUSTER:
            return True
        if resource == CLUSTER:
            return False
        if resource.count("/") == 1:  # a namespace "/ns"
            return pattern in (resource, resource + "/*") or fnmatchcase(resource, pattern)
        if fnmatchcase(resource, pattern):
            return True
        base = _PARTITION.match(resource) or _SEGMENT.match(resource)
        return base is not None and fnmatchcase(base.group(1), pattern)


@dataclass(frozen=True)
class Role:
    name: str
    grants: tuple[Grant, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "permissions": [str(g) for g in self.grants]}

    @classmethod
    def from_json(cls, doc: dict) -> "Role":
        return cls(str(doc["name"]), tuple(Grant.parse(g) for g in doc.get("permissions", ())))


def check_role_name(name: str) -> str:
    if not isinstance(name, str) or not _ROLE_NAME.match(name):
        raise InvalidArgumentError(f"bad role name {name!r}: 1-128 letters, digits, '_', '.', ':', '-'")
    return name


class Authorizer:
    """Roles and bindings from the metadata store; ``check`` raises PermissionDeniedError."""

    def __init__(self, metadata, *, super_admins: Iterable[str] = (), refresh_s: float = 5.0) -> None:
        self.metadata = metadata
        self.super_admins = frozenset(super_admins)
        self.refresh_s = refresh_s
        self._roles: dict[str, Role] = {}
        self._bindings: dict[str, tuple[str, ...]] = {}
        self._decisions: dict[tuple[str, str, str | None], bool] = {}
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.load()
        if self.refresh_s > 0:
            self._task = asyncio.ensure_future(self._refresh_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._task = None

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.load()
            except Exception:  # noqa: BLE001 - keep the last good state, try again later
                log.warning("re-reading RBAC roles and bindings failed", exc_info=True)

    async def load(self) -> None:
        roles: dict[str, Role] = {}
        for kv in await self.metadata.get_prefix(keys.security_roles()):
            try:
                role = Role.from_json(json.loads(kv.value))
                roles[role.name] = role
            except (ValueError, KeyError, TypeError, InvalidArgumentError) as exc:
                log.warning("ignoring a malformed role at %s: %s", kv.key, exc)
        bindings: dict[str, tuple[str, ...]] = {}
        for kv in await self.metadata.get_prefix(keys.security_bindings()):
            try:
                doc = json.loads(kv.value)
                bindings[str(doc["subject"])] = tuple(str(r) for r in doc.get("roles", ()))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring a malformed role binding at %s: %s", kv.key, exc)
        if roles != self._roles or bindings != self._bindings:
            self._roles, self._bindings = roles, bindings
            self._decisions = {}

    # ------------------------------------------------------------ the check

    def allowed(self, subject: str, permission: str, resource: str | None) -> bool:
        key = (subject, permission, resource)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._decide(subject, permission, resource)
            if len(self._decisions) >= _DECISIONS_MAX:
                self._decisions = {}
            self._decisions[key] = decision
        return decision

    def _decide(self, subject: str, permission: str, resource: str | None) -> bool:
        if subject in self.super_admins:
            return True
        for role_name in self._bindings.get(subject, ()):
            role = self._roles.get(role_name)
            if role is not None and any(g.covers(permission, resource) for g in role.grants):
                return True
        return False

    def check(self, subject: str, permission: str, resource: str | None) -> None:
        if not self.allowed(subject, permission, resource):
            where = "any resource" if resource is ANY_RESOURCE else ("the cluster" if resource == CLUSTER else resource)
            raise PermissionDeniedError(
                f"permission {permission!r} on {where} denied to {subject!r}: no role bound to it grants "
                f"{permission} there (danube admin security bindings ...)",
                permission=permission,
                resource=resource,
                principal=subject,
            )

    # ------------------------------------------------------------ management (admin service)

    def roles(self) -> list[dict]:
        return [self._roles[name].to_json() for name in sorted(self._roles)]

    def bindings(self) -> list[dict]:
        return [{"subject": s, "roles": list(r)} for s, r in sorted(self._bindings.items())]

    async def put_role(self, name: str, grants: Iterable[str]) -> dict:
        role = Role(check_role_name(name), tuple(Grant.parse(g) for g in grants))
        if not role.grants:
            raise InvalidArgumentError(f"role {name!r} needs at least one PERMISSION:PATTERN grant")
        await self.metadata.put_json(keys.security_role(name), role.to_json())
        await self.load()
        return role.to_json()

    async def delete_role(self, name: str) -> None:
        if not await self.metadata.delete(keys.security_role(check_role_name(name))):
            raise NotFoundError(f"role {name!r} does not exist")
        await self.load()

    async def bind(self, subject: str, roles: Iterable[str]) -> dict:
        if not isinstance(subject, str) or not subject or len(subject) > 1024:
            raise InvalidArgumentError("a binding needs a subject (1-1024 characters)")
        roles = [check_role_name(r) for r in roles]
        if not roles:
            raise InvalidArgumentError("a binding needs at least one role")
        unknown = [r for r in roles if r not in self._roles]
        if unknown:
            raise NotFoundError(
                f"unknown role(s) {', '.join(unknown)}: create them first (danube admin security roles create)"
            )
        merged = list(dict.fromkeys([*self._bindings.get(subject, ()), *roles]))
        doc = {"subject": subject, "roles": merged}
        await self.metadata.put_json(keys.security_binding(subject), doc)
        await self.load()
        return doc

    async def unbind(self, subject: str, roles: Iterable[str] = ()) -> None:
        current = self._bindings.get(subject)
        if current is None:
            raise NotFoundError(f"subject {subject!r} has no role binding")
        roles = list(roles)
        left = [r for r in current if r not in roles] if roles else []
        if left:
            await self.metadata.put_json(keys.security_binding(subject), {"subject": subject, "roles": left})
        else:
            await self.metadata.delete(keys.security_binding(subject))
        await self.load()
