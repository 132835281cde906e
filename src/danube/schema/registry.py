"""The schema registry's storage model over a :class:`~danube.metadata.store.MetadataStore`.

Keys (``danube.metadata.keys``)::

    /schemas/next_id                               the next schema id (compare-and-swap)
    /schemas/ids/<id:020d>                         schema id → subject
    /schemas/subjects/<subject>/meta               SubjectRecord JSON
    /schemas/subjects/<subject>/versions/<v:010d>  VersionRecord JSON (definition, fingerprint, ...)
    /schemas/topics/<ns>/<topic>                   TopicSchemaConfig JSON

As in Danube, a schema id names a *subject*: every version of a subject shares the id, which is
globally unique and never reused; versions count 1, 2, 3 ... and a deleted version's number is
not given again.  Registering a schema whose fingerprint equals a live version of the subject
returns that version (``is_new_version`` false).  The subject record is the commit point: a
new version is written first, then the subject record with ``put_if_version``, so two brokers
registering at once cannot both take the same version number (the loser retries).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from danube.errors import InvalidArgumentError
from danube.metadata import keys
from danube.metadata.store import MetadataStore
from danube.schema import compat
from danube.schema.errors import IncompatibleSchemaError, InvalidSchemaError, SchemaNotFoundError
from danube.schema.types import ParsedSchema, normalize_mode, normalize_policy, normalize_type, parse

log = logging.getLogger(__name__)

DEFAULT_COMPATIBILITY = "backward"
MAX_SUBJECT_LEN = 255
_CAS_RETRIES = 50


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class SchemaVersion:
    """One version of a subject, as the RPCs report it."""

    schema_id: int
    subject: str
    version: int
    schema_type: str
    definition: bytes
    fingerprint: str
    description: str = ""
    created_by: str = ""
    created_at: int = 0
    tags: list[str] = field(default_factory=list)
    compatibility_mode: str = DEFAULT_COMPATIBILITY
    deleted: bool = False


@dataclass
class TopicSchemaConfig:
    topic: str
    subject: str = ""
    validation_policy: str = "none"
    payload_validation: bool = False

    def to_json(self) -> dict:
        return {
            "subject": self.subject,
            "validation_policy": self.validation_policy,
            "payload_validation": self.payload_validation,
        }


def base_topic(topic: str) -> str:
    """``/ns/t-part-3`` → ``/ns/t``; other names unchanged."""
    cut = topic.rfind("-part-")
    if cut > 0 and topic[cut + 6 :].isdigit():
        return topic[:cut]
    return topic


def check_subject(subject: str) -> str:
    """The registry's subject rule (the gateway checks names with it before calling the broker)."""
    if not isinstance(subject, str) or not subject.strip():
        raise InvalidArgumentError("schema subject must not be empty")
    if len(subject) > MAX_SUBJECT_LEN:
        raise InvalidArgumentError(f"schema subject is {len(subject)} characters; at most {MAX_SUBJECT_LEN}")
    if any(ord(c) < 32 for c in subject):
        raise InvalidArgumentError("schema subject must not contain control characters")
    return subject


def _encode_definition(definition: bytes) -> dict:
    try:
        return {"definition": definition.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"definition": base64.b64encode(definition).decode(), "encoding": "base64"}


def _decode_definition(rec: dict) -> bytes:
    if rec.get("encoding") == "base64":
        return base64.b64decode(rec["definition"])
    return rec.get("definition", "").encode("utf-8")


class SchemaRegistry:
    """Subjects, versions, ids, compatibility modes and topic schema configs."""

    def __init__(self, metadata: MetadataStore, json_schema_rule: str = compat.DEFAULT_JSON_SCHEMA_RULE) -> None:
        self.metadata = metadata
        # the broker's JSON Schema compatibility rule; a subject's own setting wins
        self.json_schema_rule = compat.normalize_json_schema_rule(json_schema_rule)
        self._parsed: dict[str, ParsedSchema] = {}  # fingerprint → parsed schema
        self._listeners: list[Callable[[], Any]] = []
        self._lock = asyncio.Lock()

    def add_listener(self, callback: Callable[[], Any]) -> None:
        """Called (no arguments) after every change this registry makes."""
        self._listeners.append(callback)

    def _changed(self) -> None:
        for cb in self._listeners:
            try:
                cb()
            except Exception:  # noqa: BLE001 - a listener's bug must not fail the RPC
                log.exception("schema registry listener failed")

    # ------------------------------------------------------------ reads

    async def _subject_record(self, subject: str):
        kv = await self.metadata.get(keys.schema_subject(subject))
        if kv is None:
            return None, 0
        return json.loads(kv.value), kv.version

    async def _require_subject(self, subject: str) -> dict:
        check_subject(subject)
        rec, _ = await self._subject_record(subject)
        if rec is None:
            raise SchemaNotFoundError(f"schema subject {subject!r} not found")
        return rec

    def _version_from(self, meta: dict, rec: dict) -> SchemaVersion:
        return SchemaVersion(
            schema_id=int(meta["schema_id"]),
            subject=meta["subject"],
            version=int(rec["version"]),
            schema_type=meta["schema_type"],
            definition=_decode_definition(rec),
            fingerprint=rec["fingerprint"],
            description=rec.get("description", ""),
            created_by=rec.get("created_by", ""),
            created_at=int(rec.get("created_at", 0)),
            tags=list(rec.get("tags", [])),
            compatibility_mode=meta.get("compatibility_mode", DEFAULT_COMPATIBILITY),
            deleted=bool(rec.get("deleted", False)),
        )

    async def _all_versions(self, meta: dict) -> list[SchemaVersion]:
        kvs = await self.metadata.get_prefix(keys.schema_versions(meta["subject"]))
        return [self._version_from(meta, json.loads(kv.value)) for kv in kvs]

    async def versions(self, subject: str, *, include_deleted: bool = False) -> list[SchemaVersion]:
        meta = await self._require_subject(subject)
        return [v for v in await self._all_versions(meta) if include_deleted or not v.deleted]

    async def latest(self, subject: str) -> SchemaVersion:
        live = await self.versions(subject)
        if not live:
            raise SchemaNotFoundError(f"schema subject {subject!r} has no versions (all were deleted)")
        return live[-1]

    async def subject_for_id(self, schema_id: int) -> str:
        kv = await self.metadata.get(keys.schema_id_index(int(schema_id)))
        if kv is None:
            raise SchemaNotFoundError(f"schema id {schema_id} not found")
        return kv.value.decode()

    async def get(self, schema_id: int, version: int | None = None, *, include_deleted: bool = False) -> SchemaVersion:
        """A subject's version by schema id (latest live one when ``version`` is None)."""
        subject = await self.subject_for_id(schema_id)
        if version is None:
            return await self.latest(subject)
        return await self.version(subject, version, include_deleted=include_deleted)

    async def version(self, subject: str, version: int, *, include_deleted: bool = False) -> SchemaVersion:
        meta = await self._require_subject(subject)
        kv = await self.metadata.get(keys.schema_version(subject, int(version)))
        if kv is not None:
            v = self._version_from(meta, json.loads(kv.value))
            if include_deleted or not v.deleted:
                return v
        raise SchemaNotFoundError(f"schema subject {subject!r} has no version {version}")

    async def subjects(self) -> list[str]:
        kvs = await self.metadata.get_prefix(keys.schema_subjects())
        return [json.loads(kv.value)["subject"] for kv in kvs if kv.key.endswith("/meta")]

    async def compatibility_mode(self, subject: str) -> str:
        return (await self._require_subject(subject)).get("compatibility_mode", DEFAULT_COMPATIBILITY)

    def parsed(self, v: SchemaVersion) -> ParsedSchema:
        """The parsed form of a stored version (cached by fingerprint)."""
        p = self._parsed.get(v.fingerprint)
        if p is None:
            p = self._parsed[v.fingerprint] = parse(v.schema_type, v.definition)
        return p

    # ------------------------------------------------------------ writes

    async def _allocate_id(self) -> int:
        for _ in range(_CAS_RETRIES):
            kv = await self.metadata.get(keys.schema_next_id())
            current = int(kv.value) if kv is not None else 1
            if await self.metadata.put_if_version(
                keys.schema_next_id(), str(current + 1).encode(), kv.version if kv is not None else 0
            ):
                return current
        raise InvalidArgumentError("could not allocate a schema id (too much contention)")

    async def register(
        self,
        subject: str,
        schema_type: str,
        definition: bytes,
        *,
        description: str = "",
        created_by: str = "",
        tags: list[str] | tuple = (),
    ) -> tuple[SchemaVersion, bool]:
        """Register ``definition`` under ``subject``: (the version, whether it is new).

        Raises InvalidSchemaError (bad type or definition, or another type than the subject's)
        and IncompatibleSchemaError (with ``reasons``) under the subject's compatibility mode."""
        check_subject(subject)
        schema_type = normalize_type(schema_type)
        p = parse(schema_type, definition)
        async with self._lock:
            result = await self._register(subject, p, description, created_by, list(tags))
        if result[1]:
            self._changed()
        return result

    async def _register(self, subject, p: ParsedSchema, description, created_by, tags):
        for _ in range(_CAS_RETRIES):
            meta, meta_version = await self._subject_record(subject)
            now = _now_ms()
            if meta is None:
                schema_id = None
                number = 1
            else:
                if meta["schema_type"] != p.schema_type:
                    raise InvalidSchemaError(
                        f"subject {subject!r} holds {meta['schema_type']} schemas; "
                        f"cannot register a {p.schema_type} schema under it"
                    )
                existing = await self._all_versions(meta)
                for v in existing:
                    if not v.deleted and v.fingerprint == p.fingerprint:
                        return v, False
                live = [v for v in existing if not v.deleted]
                mode = meta.get("compatibility_mode", DEFAULT_COMPATIBILITY)
                if live and mode != "none":
                    reasons = compat.check(self.parsed(live[-1]), p, mode, self._json_rule(meta))
                    if reasons:
                        raise IncompatibleSchemaError(
                            f"schema is not {mode} compatible with version {live[-1].version} of subject "
                            f"{subject!r}: " + "; ".join(reasons),
                            reasons,
                        )
                schema_id = int(meta["schema_id"])
                number = int(meta["latest_version"]) + 1
            if schema_id is None:
                schema_id = await self._allocate_id()
            record = {
                "version": number,
                "fingerprint": p.fingerprint,
                "description": description or "",
                "created_by": created_by or "",
                "created_at": now,
                "tags": list(tags),
                "deleted": False,
                **_encode_definition(p.definition),
            }
            await self.metadata.put_json(keys.schema_version(subject, number), record)
            new_meta = (
                dict(meta)
                if meta
                else {
                    "schema_id": schema_id,
                    "subject": subject,
                    "schema_type": p.schema_type,
                    "compatibility_mode": DEFAULT_COMPATIBILITY,
                    "created_at": now,
                    "created_by": created_by or "",
                }
            )
            new_meta["latest_version"] = number
            payload = json.dumps(new_meta, sort_keys=True, separators=(",", ":")).encode()
            if await self.metadata.put_if_version(keys.schema_subject(subject), payload, meta_version):
                if meta is None:
                    await self.metadata.put(keys.schema_id_index(schema_id), subject.encode())
                self._parsed[p.fingerprint] = p
                log.info("schema subject %r: version %d (id %d, %s)", subject, number, schema_id, p.schema_type)
                meta = new_meta
                return self._version_from(new_meta, record), True
            # another writer moved the subject on: try again on its latest state
        raise InvalidArgumentError(f"could not register a schema under {subject!r} (too much contention)")

    async def check(self, subject: str, schema_type: str, definition: bytes, mode: str | None = None) -> list[str]:
        """Reasons ``definition`` would break ``mode`` (default: the subject's) — [] = compatible."""
        meta = await self._require_subject(subject)
        mode = normalize_mode(mode) if mode else meta.get("compatibility_mode", DEFAULT_COMPATIBILITY)
        try:
            p = parse(schema_type, definition)
        except InvalidSchemaError as exc:
            return [str(exc)]
        live = [v for v in await self._all_versions(meta) if not v.deleted]
        if not live:
            return []
        if p.schema_type != meta["schema_type"]:
            return [f"subject {subject!r} holds {meta['schema_type']} schemas, not {p.schema_type}"]
        return compat.check(self.parsed(live[-1]), p, mode, self._json_rule(meta))

    def _json_rule(self, meta: dict) -> str:
        return meta.get("json_schema_rule") or self.json_schema_rule

    async def _update_subject(self, subject: str, change: Callable[[dict], None]) -> dict:
        for _ in range(_CAS_RETRIES):
            meta, meta_version = await self._subject_record(subject)
            if meta is None:
                raise SchemaNotFoundError(f"schema subject {subject!r} not found")
            change(meta)
            payload = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
            if await self.metadata.put_if_version(keys.schema_subject(subject), payload, meta_version):
                return meta
        raise InvalidArgumentError(f"could not update subject {subject!r} (too much contention)")

    async def set_compatibility_mode(self, subject: str, mode: str, json_schema_rule: str | None = None) -> None:
        """Set the subject's mode and, when given, its JSON Schema rule (``danube`` or
        ``reader_writer``; ``default`` goes back to the broker's)."""
        check_subject(subject)
        mode = normalize_mode(mode)
        rule = None
        if json_schema_rule and json_schema_rule.strip().lower() != "default":
            rule = compat.normalize_json_schema_rule(json_schema_rule)

        def change(meta: dict) -> None:
            meta["compatibility_mode"] = mode
            if rule is not None:
                meta["json_schema_rule"] = rule
            elif json_schema_rule:
                meta.pop("json_schema_rule", None)

        await self._update_subject(subject, change)
        self._changed()

    async def json_schema_rule_of(self, subject: str) -> str:
        """The JSON Schema rule in force for ``subject`` (its own, else the broker's)."""
        return self._json_rule(await self._require_subject(subject))

    async def delete_version(self, subject: str, version: int) -> None:
        """Soft delete: the version leaves listings, ``latest`` and what a topic accepts; its
        definition stays stored so data written with it can still be decoded (Spark, CLI)."""
        v = await self.version(subject, version)
        key = keys.schema_version(subject, v.version)
        kv = await self.metadata.get(key)
        if kv is None:  # removed by another writer since it was read just above
            raise SchemaNotFoundError(f"schema subject {subject!r} has no version {version}")
        rec = json.loads(kv.value)
        rec["deleted"] = True
        rec["deleted_at"] = _now_ms()
        await self.metadata.put_json(key, rec)
        self._changed()

    # ------------------------------------------------------------ topics

    async def topic_config(self, topic: str) -> TopicSchemaConfig:
        doc = await self.metadata.get_json(keys.topic_schema_config(topic))
        if not doc:
            return TopicSchemaConfig(topic)
        return TopicSchemaConfig(
            topic,
            doc.get("subject", ""),
            doc.get("validation_policy", "none"),
            bool(doc.get("payload_validation", False)),
        )

    async def topic_configs(self) -> list[TopicSchemaConfig]:
        out = []
        root = keys.topic_schema_configs()
        for kv in await self.metadata.get_prefix(root):
            ns_topic = "/" + kv.key[len(root) :]
            doc = json.loads(kv.value)
            out.append(
                TopicSchemaConfig(
                    ns_topic,
                    doc.get("subject", ""),
                    doc.get("validation_policy", "none"),
                    bool(doc.get("payload_validation", False)),
                )
            )
        return out

    async def configure_topic(
        self, topic: str, subject: str, validation_policy: str = "none", payload_validation: bool = False
    ) -> TopicSchemaConfig:
        keys.split_topic(topic)
        policy = normalize_policy(validation_policy)
        await self._require_subject(subject)
        cfg = TopicSchemaConfig(topic, subject, policy, bool(payload_validation))
        await self.metadata.put_json(keys.topic_schema_config(topic), cfg.to_json())
        self._changed()
        return cfg

    async def update_topic_policy(
        self, topic: str, validation_policy: str, payload_validation: bool = False
    ) -> TopicSchemaConfig:
        cfg = await self.topic_config(topic)
        if not cfg.subject:
            raise SchemaNotFoundError(f"topic {topic} has no schema subject configured (ConfigureTopicSchema first)")
        cfg.validation_policy = normalize_policy(validation_policy)
        cfg.payload_validation = bool(payload_validation)
        await self.metadata.put_json(keys.topic_schema_config(topic), cfg.to_json())
        self._changed()
        return cfg

    async def forget_topic(self, topic: str) -> None:
        """A deleted topic's schema configuration goes with it."""
        if await self.metadata.get(keys.topic_schema_config(topic)) is not None:
            await self.metadata.delete(keys.topic_schema_config(topic))
            self._changed()

    async def assign_topic_subject(self, topic: str, subject: str) -> TopicSchemaConfig:
        """A schema-aware producer's subject for a topic (Danube: the first one assigns it).

        A topic without a subject takes this one (policy unchanged, ``none`` by default); a topic
        with another subject refuses the producer.  A partition ``T-part-i`` is the partitioned
        topic ``T`` here: the config is ``T``'s, which every partition follows."""
        topic = base_topic(topic)
        cfg = await self.topic_config(topic)
        await self._require_subject(subject)
        if cfg.subject and cfg.subject != subject:
            raise InvalidArgumentError(
                f"topic {topic} uses schema subject {cfg.subject!r}; a producer asked for {subject!r}"
            )
        if not cfg.subject:
            cfg.subject = subject
            await self.metadata.put_json(keys.topic_schema_config(topic), cfg.to_json())
            self._changed()
        return cfg
