"""The schema registry from danube's client (Danube's ``danube_schema.SchemaRegistry``).

    registry = SchemaRegistryClient(client)
    schema_id, version, new = await registry.register("users", "avro", avsc_bytes)
    info = await registry.latest("users")

Producers built with ``with_schema_subject`` / ``with_schema_version`` /
``with_schema_min_version`` resolve their schema here on ``create()`` (as Danube's clients do)
and then send the schema id and version with every batch (docs/schema-registry.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from danube.client.errors import from_rpc_error
from danube.errors import ClientError, InvalidArgumentError
from danube.proto.danube_schema import SchemaRegistry_pb2 as pb
from danube.proto.danube_schema import SchemaRegistry_pb2_grpc as pb_grpc

_TIMEOUT_S = 10.0


@dataclass
class SchemaInfo:
    schema_id: int
    subject: str
    version: int
    schema_type: str
    schema_definition: bytes
    fingerprint: str
    compatibility_mode: str = ""
    description: str = ""
    created_by: str = ""
    created_at: int = 0
    tags: list[str] = field(default_factory=list)


def _info(r) -> SchemaInfo:
    return SchemaInfo(
        r.schema_id,
        r.subject,
        r.version,
        r.schema_type,
        r.schema_definition,
        r.fingerprint,
        r.compatibility_mode,
        r.description,
        r.created_by,
        r.created_at,
        list(r.tags),
    )


class SchemaRegistryClient:
    """Async registry calls on the client's service URL; errors are ``danube.errors`` types."""

    def __init__(self, client) -> None:
        self._client = client

    def _stub(self) -> pb_grpc.SchemaRegistryStub:
        return pb_grpc.SchemaRegistryStub(self._client.connection().channel)

    async def _call(self, method: str, request):
        try:
            return await getattr(self._stub(), method)(request, timeout=_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from exc

    async def register(
        self,
        subject: str,
        schema_type: str,
        definition: bytes | str,
        *,
        description: str = "",
        created_by: str = "danube-client",
        tags=(),
    ) -> tuple[int, int, bool]:
        """(schema id, version, whether the version is new)."""
        if isinstance(definition, str):
            definition = definition.encode()
        r = await self._call(
            "RegisterSchema",
            pb.RegisterSchemaRequest(
                subject=subject,
                schema_type=schema_type,
                schema_definition=definition,
                description=description,
                created_by=created_by,
                tags=list(tags),
            ),
        )
        return r.schema_id, r.version, r.is_new_version

    async def get(self, schema_id: int, version: int | None = None) -> SchemaInfo:
        req = pb.GetSchemaRequest(schema_id=schema_id)
        if version is not None:
            req.version = version
        return _info(await self._call("GetSchema", req))

    async def latest(self, subject: str) -> SchemaInfo:
        return _info(await self._call("GetLatestSchema", pb.GetLatestSchemaRequest(subject=subject)))

    async def versions(self, subject: str) -> list[int]:
        r = await self._call("ListVersions", pb.ListVersionsRequest(subject=subject))
        return [v.version for v in r.versions]

    async def check(
        self, subject: str, schema_type: str, definition: bytes | str, mode: str | None = None
    ) -> tuple[bool, list[str]]:
        if isinstance(definition, str):
            definition = definition.encode()
        req = pb.CheckCompatibilityRequest(subject=subject, new_schema_definition=definition, schema_type=schema_type)
        if mode is not None:
            req.compatibility_mode = mode
        r = await self._call("CheckCompatibility", req)
        return r.is_compatible, list(r.errors)

    async def _change(self, method: str, request) -> str:
        r = await self._call(method, request)
        if not r.success:
            raise InvalidArgumentError(r.message)
        return r.message

    async def set_compatibility_mode(self, subject: str, mode: str) -> str:
        return await self._change(
            "SetCompatibilityMode", pb.SetCompatibilityModeRequest(subject=subject, compatibility_mode=mode)
        )

    async def delete_version(self, subject: str, version: int) -> str:
        return await self._change(
            "DeleteSchemaVersion", pb.DeleteSchemaVersionRequest(subject=subject, version=version)
        )

    async def configure_topic(
        self, topic: str, subject: str, policy: str = "none", payload_validation: bool = False
    ) -> str:
        return await self._change(
            "ConfigureTopicSchema",
            pb.ConfigureTopicSchemaRequest(
                topic_name=topic,
                schema_subject=subject,
                validation_policy=policy,
                enable_payload_validation=payload_validation,
            ),
        )

    async def update_topic_policy(self, topic: str, policy: str, payload_validation: bool = False) -> str:
        return await self._change(
            "UpdateTopicValidationPolicy",
            pb.UpdateTopicValidationPolicyRequest(
                topic_name=topic, validation_policy=policy, enable_payload_validation=payload_validation
            ),
        )

    async def topic_config(self, topic: str):
        return await self._call("GetTopicSchemaConfig", pb.GetTopicSchemaConfigRequest(topic_name=topic))

    async def resolve(self, subject: str, *, version: int | None = None, min_version: int | None = None) -> SchemaInfo:
        """The version a producer uses: pinned, at least ``min_version``, or the latest."""
        latest = await self.latest(subject)
        if version is not None:
            return latest if version == latest.version else await self.get(latest.schema_id, version)
        if min_version is not None and latest.version < min_version:
            raise ClientError(
                f"schema subject {subject!r} is at version {latest.version}, below the "
                f"minimum {min_version} this producer needs"
            )
        return latest
