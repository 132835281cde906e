"""``danube_admin.SecurityAdmin`` on the admin port: roles and role bindings.

Requests and responses are JSON documents (UTF-8 bytes) rather than protobuf messages, so
the service needs no generated code; ``danube admin security ...`` is its client.  As every
admin method, it needs the ``admin`` permission on the cluster when authentication is on.

    ListRoles {}                                 -> {"roles": [{"name", "permissions": [...]}]}
    PutRole {"name", "permissions": ["produce:/default/*", ...]}   -> the role
    DeleteRole {"name"}                          -> {}
    ListBindings {}                              -> {"bindings": [{"subject", "roles": [...]}]}
    Bind {"subject", "roles": [...]}             -> the binding (roles are added)
    Unbind {"subject", "roles": [...]?}          -> {} (no roles: the whole binding goes)
"""

from __future__ import annotations

import functools
import json
import logging

import grpc

from danube.errors import DanubeError, InvalidArgumentError
from danube.security.rbac import Authorizer
from danube.server.status import abort

log = logging.getLogger(__name__)

SERVICE = "danube_admin.SecurityAdmin"


def _decode(data: bytes) -> dict:
    try:
        doc = json.loads(data.decode("utf-8")) if data else {}
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidArgumentError(f"the request is not a JSON document: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgumentError("the request must be a JSON object")
    return doc


def _encode(doc) -> bytes:
    return json.dumps(doc, sort_keys=True).encode("utf-8")


def _strings(doc: dict, key: str) -> list[str]:
    value = doc.get(key) or []
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise InvalidArgumentError(f"{key!r} must be a list of strings")
    return list(value)


def _json_method(action):
    """An RPC handler from ``action(self, doc) -> response document``: the request decoded from
    JSON, a DanubeError answered with its status."""

    @functools.wraps(action)
    async def handler(self, data: bytes, context):
        try:
            return await action(self, _decode(data))
        except DanubeError as exc:
            await abort(context, exc)

    return handler


class SecurityAdmin:
    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    @_json_method
    async def ListRoles(self, doc):
        await self.authorizer.load()
        return {"roles": self.authorizer.roles()}

    @_json_method
    async def PutRole(self, doc):
        role = await self.authorizer.put_role(str(doc.get("name", "")), _strings(doc, "permissions"))
        log.info("security: role %s set to %s", role["name"], ", ".join(role["permissions"]))
        return role

    @_json_method
    async def DeleteRole(self, doc):
        await self.authorizer.delete_role(str(doc.get("name", "")))
        log.info("security: role %s deleted", doc.get("name"))
        return {}

    @_json_method
    async def ListBindings(self, doc):
        await self.authorizer.load()
        return {"bindings": self.authorizer.bindings()}

    @_json_method
    async def Bind(self, doc):
        binding = await self.authorizer.bind(str(doc.get("subject", "")), _strings(doc, "roles"))
        log.info("security: subject %r bound to %s", binding["subject"], ", ".join(binding["roles"]))
        return binding

    @_json_method
    async def Unbind(self, doc):
        await self.authorizer.unbind(str(doc.get("subject", "")), _strings(doc, "roles"))
        log.info(
            "security: binding of %r changed (%s removed)",
            doc.get("subject"),
            ", ".join(_strings(doc, "roles")) or "all roles",
        )
        return {}


METHODS = ("ListRoles", "PutRole", "DeleteRole", "ListBindings", "Bind", "Unbind")


def add_to_server(server, authorizer: Authorizer) -> None:
    service = SecurityAdmin(authorizer)
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(service, name), request_deserializer=None, response_serializer=_encode
        )
        for name in METHODS
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
