"""Danube's schema registry service (``danube_schema.SchemaRegistry``) on the client port.

Storage and rules live in ``danube.schema`` (registry, compatibility, validation); this module
only translates requests.  Errors that are a failed request (bad definition, incompatible
schema, unknown subject or id) end the call with the status ``danube.server.status`` maps them
to; the RPCs whose response has ``success``/``message`` (delete, compatibility mode, topic
config) answer ``success=false`` with the reason for a refused change, as Danube's do.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from danube.errors import DanubeError
from danube.proto.danube_schema import SchemaRegistry_pb2 as pb
from danube.proto.danube_schema import SchemaRegistry_pb2_grpc as pb_grpc
from danube.schema.errors import SchemaNotFoundError
from danube.schema.registry import SchemaRegistry, SchemaVersion
from danube.schema.validation import SchemaGate
from danube.server.status import abort

if TYPE_CHECKING:
    from danube.broker.service import BrokerService

log = logging.getLogger(__name__)


def _schema_response(v: SchemaVersion) -> pb.GetSchemaResponse:
    return pb.GetSchemaResponse(
        schema_id=v.schema_id,
        version=v.version,
        subject=v.subject,
        schema_type=v.schema_type,
        schema_definition=v.definition,
        description=v.description,
        created_at=v.created_at,
        created_by=v.created_by,
        tags=v.tags,
        fingerprint=v.fingerprint,
        compatibility_mode=v.compatibility_mode,
    )


class SchemaRegistryService(pb_grpc.SchemaRegistryServicer):
    def __init__(self, registry: SchemaRegistry, gate: SchemaGate | None = None) -> None:
        self.registry = registry
        self.gate = gate

    async def RegisterSchema(self, request, context):
        try:
            v, is_new = await self.registry.register(
                request.subject,
                request.schema_type,
                request.schema_definition,
                description=request.description,
                created_by=request.created_by,
                tags=list(request.tags),
            )
            if is_new:
                await self._applied()
        except DanubeError as exc:
            await abort(context, exc)
        return pb.RegisterSchemaResponse(
            schema_id=v.schema_id, version=v.version, is_new_version=is_new, fingerprint=v.fingerprint
        )

    async def GetSchema(self, request, context):
        try:
            v = await self.registry.get(request.schema_id, request.version if request.HasField("version") else None)
        except DanubeError as exc:
            await abort(context, exc)
        return _schema_response(v)

    async def GetLatestSchema(self, request, context):
        try:
            v = await self.registry.latest(request.subject)
        except DanubeError as exc:
            await abort(context, exc)
        return _schema_response(v)

    async def ListVersions(self, request, context):
        try:
            versions = await self.registry.versions(request.subject)
        except DanubeError as exc:
            await abort(context, exc)
        return pb.ListVersionsResponse(
            versions=[
                pb.SchemaVersionInfo(
                    version=v.version,
                    created_at=v.created_at,
                    created_by=v.created_by,
                    description=v.description,
                    fingerprint=v.fingerprint,
                    schema_id=v.schema_id,
                )
                for v in versions
            ]
        )

    async def CheckCompatibility(self, request, context):
        try:
            reasons = await self.registry.check(
                request.subject,
                request.schema_type,
                request.new_schema_definition,
                request.compatibility_mode if request.HasField("compatibility_mode") else None,
            )
        except DanubeError as exc:
            await abort(context, exc)
        return pb.CheckCompatibilityResponse(is_compatible=not reasons, errors=reasons)

    async def DeleteSchemaVersion(self, request, context):
        try:
            await self.registry.delete_version(request.subject, request.version)
            await self._applied()
        except DanubeError as exc:
            return pb.DeleteSchemaVersionResponse(success=False, message=str(exc))
        return pb.DeleteSchemaVersionResponse(
            success=True, message=f"deleted version {request.version} of subject {request.subject!r}"
        )

    async def SetCompatibilityMode(self, request, context):
        try:
            await self.registry.set_compatibility_mode(
                request.subject,
                request.compatibility_mode,
                request.json_schema_rule if request.HasField("json_schema_rule") else None,
            )
        except DanubeError as exc:
            return pb.SetCompatibilityModeResponse(success=False, message=str(exc))
        return pb.SetCompatibilityModeResponse(
            success=True, message=f"subject {request.subject!r}: compatibility {request.compatibility_mode.lower()}"
        )

    async def ConfigureTopicSchema(self, request, context):
        try:
            cfg = await self.registry.configure_topic(
                request.topic_name,
                request.schema_subject,
                request.validation_policy or "none",
                request.enable_payload_validation,
            )
            await self._applied()
        except DanubeError as exc:
            return pb.ConfigureTopicSchemaResponse(success=False, message=str(exc))
        return pb.ConfigureTopicSchemaResponse(
            success=True,
            message=f"topic {cfg.topic}: subject {cfg.subject!r}, policy {cfg.validation_policy}, "
            f"payload validation {'on' if cfg.payload_validation else 'off'}",
        )

    async def UpdateTopicValidationPolicy(self, request, context):
        try:
            cfg = await self.registry.update_topic_policy(
                request.topic_name, request.validation_policy, request.enable_payload_validation
            )
            await self._applied()
        except DanubeError as exc:
            return pb.UpdateTopicValidationPolicyResponse(success=False, message=str(exc))
        return pb.UpdateTopicValidationPolicyResponse(
            success=True,
            message=f"topic {cfg.topic}: policy {cfg.validation_policy}, "
            f"payload validation {'on' if cfg.payload_validation else 'off'}",
        )

    async def GetTopicSchemaConfig(self, request, context):
        try:
            cfg = await self.registry.topic_config(request.topic_name)
            schema_id = 0
            if cfg.subject:
                try:
                    schema_id = (await self.registry.latest(cfg.subject)).schema_id
                except DanubeError:
                    schema_id = 0
        except DanubeError as exc:
            await abort(context, exc)
        return pb.GetTopicSchemaConfigResponse(
            schema_subject=cfg.subject,
            validation_policy=cfg.validation_policy,
            enable_payload_validation=cfg.payload_validation,
            schema_id=schema_id,
        )

    async def ListSubjects(self, request, context):
        summaries = []
        try:
            for subject in await self.registry.subjects():
                try:
                    v = await self.registry.latest(subject)
                except SchemaNotFoundError:  # every version deleted: nothing a producer could use
                    continue
                summaries.append(
                    pb.SubjectSummary(
                        subject=subject,
                        schema_type=v.schema_type,
                        latest_version=v.version,
                        compatibility_mode=str(v.compatibility_mode).upper(),
                        schema_id=v.schema_id,
                        tags=v.tags,
                    )
                )
        except DanubeError as exc:
            await abort(context, exc)
        return pb.ListSubjectsResponse(subjects=summaries)

    async def _applied(self) -> None:
        """A config change is in force on this broker when the RPC answers: the gate's refresh,
        scheduled by the registry's change, has run."""
        if self.gate is not None:
            await self.gate.settled()


def add_to_server(server: Any, registry: SchemaRegistry, gate: SchemaGate | None = None) -> SchemaRegistryService:
    service = SchemaRegistryService(registry, gate)
    pb_grpc.add_SchemaRegistryServicer_to_server(service, server)
    return service


async def attach(server: Any, broker: BrokerService, metadata: Any, json_schema_rule: str = "danube") -> SchemaGate:
    """Registry + gate for a broker: serves the registry on ``server`` and hands the gate to the
    publish paths as ``broker.schema_gate`` (Danube's protocol and the batch lane read it)."""
    registry = SchemaRegistry(metadata, json_schema_rule)
    gate = SchemaGate(registry)
    await gate.start()
    broker.schema_gate = gate
    add_to_server(server, registry, gate)
    return gate
