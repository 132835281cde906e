"""Topic schema policies at publish time, payload validators and decoders.

A topic's schema config (``ConfigureTopicSchema``) names a subject, a validation policy and
whether payloads are validated:

- ``none``: nothing is checked (the default; also every topic without a config);
- ``warn``: a publish breaking the rules below is stored, logged and counted;
- ``enforce``: it is refused (``SchemaViolationError`` → ``INVALID_ARGUMENT``), nothing stored.

The rules: the publish names a schema id and version (Danube's ``StreamMessage.schema_id`` /
``schema_version``; the batch lane's ``PublishRequest.schema_id`` / ``schema_version``), the id
is the topic's subject's and the version is a live version of it.  With payload validation on,
every payload must also parse under that version (Avro: ``fastavro`` reads exactly the
payload's bytes; JSON Schema: JSON that the schema's validator accepts; Protobuf: the message
parses; string: UTF-8; number: a JSON number in UTF-8 or 8 bytes).

On the batch lane the ids are checked once per batch, and one compiled pass over the frames
checks that every message carries them (``danube._core.avrocheck.check_attribute``);
payload validation reads every payload.

Frames carry the schema as one attribute, :data:`SCHEMA_ATTR` = ``"<id>:<version>"`` (23 bytes
a message for small ids): the frame format has no schema field, and this way
the WAL, segments and Spark see it too.  Danube's ``ReceiveMessages`` turns them back into
``StreamMessage.schema_id`` / ``schema_version``.

:class:`SchemaGate` keeps every topic's rule in memory, rebuilt when this broker's registry
changes something and, for changes made through another broker, when the metadata store
reports a write under ``/schemas/``.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable

from danube import message_codec as frame_codec
from danube.errors import DanubeError
from danube.metadata import keys
from danube.schema.errors import SchemaViolationError
from danube.schema.registry import SchemaRegistry, SchemaVersion
from danube.schema.tag import (  # noqa: F401  (re-exported: the tag is part of this module's API)
    SCHEMA_ATTR,
    parse_schema_value,
    schema_attributes,
    schema_value,
    split_schema_attributes,
)
from danube.schema.types import ParsedSchema, protobuf_main_message

log = logging.getLogger(__name__)

_SCHEMA_NAME = SCHEMA_ATTR.encode()
_WARN_LOG_INTERVAL_S = 10.0


# ---------------------------------------------------------------- payloads


def payload_validator(p: ParsedSchema) -> Callable[[Any], None]:
    """A function that raises ValueError (with the reason) for a payload ``p`` does not accept."""
    t = p.schema_type
    if t == "bytes":
        return lambda payload: None
    if t == "string":

        def check_string(payload):
            try:
                bytes(payload).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"not UTF-8: {exc}") from None

        return check_string
    if t == "number":

        def check_number(payload):
            if len(payload) == 8:
                return
            try:
                value = json.loads(bytes(payload))
            except (ValueError, UnicodeDecodeError):
                value = None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError("not a number (a JSON number in UTF-8, or 8 bytes)")

        return check_number
    if t == "avro":
        prog = avro_program(p)
        check_payload = _avrocheck().check_payload

        def check_avro(payload):
            bad = check_payload(prog, payload)
            if bad >= 0:
                raise ValueError(_avro_reason(p, payload, bad))

        return check_avro
    if t == "json_schema":
        loads = json.loads
        try:
            # jsonschema-rs (Rust): ~5 µs a 100 B document against jsonschema's ~29 (bench --micro)
            import jsonschema_rs

            fast = jsonschema_rs.validator_for(p.parsed)
        except Exception:  # noqa: BLE001 - not installed, or a schema it does not take: jsonschema
            fast = None
        if fast is not None:

            def check_json_fast(payload):
                try:
                    doc = loads(bytes(payload))
                except (ValueError, UnicodeDecodeError) as exc:
                    raise ValueError(f"not JSON: {exc}") from None
                if not fast.is_valid(doc):
                    error = next(iter(fast.iter_errors(doc)), None)
                    where = "/".join(map(str, getattr(error, "instance_path", ()) or ())) or "root"
                    raise ValueError(f"JSON Schema: {getattr(error, 'message', error)} (at {where})")

            return check_json_fast
        import jsonschema

        cls = jsonschema.validators.validator_for(p.parsed, default=jsonschema.Draft202012Validator)
        validator = cls(p.parsed)

        def check_json(payload):
            try:
                doc = loads(bytes(payload))
            except (ValueError, UnicodeDecodeError) as exc:
                raise ValueError(f"not JSON: {exc}") from None
            error = next(iter(validator.iter_errors(doc)), None)
            if error is not None:
                where = "/".join(map(str, error.absolute_path)) or "root"
                raise ValueError(f"JSON Schema: {error.message} (at {where})")

        return check_json
    if t == "protobuf":
        from google.protobuf import message_factory
        from google.protobuf.message import DecodeError

        cls = message_factory.GetMessageClass(protobuf_main_message(p))

        def check_protobuf(payload):
            try:
                cls.FromString(bytes(payload))
            except (DecodeError, ValueError) as exc:
                raise ValueError(f"not a {cls.DESCRIPTOR.full_name}: {exc}") from None

        return check_protobuf
    raise ValueError(f"no validator for schema type {t}")


def _avrocheck():
    from danube import _native

    return _native.load("avrocheck")


def avro_program(p: ParsedSchema) -> array:
    """The compiled checker program of an Avro schema (cached on the parsed schema)."""
    prog = p._avro_program
    if prog is None:
        from danube.schema.avro_program import compile_avro

        prog = compile_avro(p.parsed, p.named)
        p._avro_program = prog
    return prog


def _avro_reason(p: ParsedSchema, payload, bad: int) -> str:
    """Why a payload is not a datum of ``p`` (fastavro's own words where it has any)."""
    from fastavro import schemaless_reader

    name = p.parsed.get("name", "datum") if isinstance(p.parsed, dict) else "datum"
    bio = io.BytesIO(bytes(payload))
    try:
        schemaless_reader(bio, p.parsed, None)
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a bad payload
        return f"not an Avro {name} (byte {bad} of {len(payload)}): {type(exc).__name__}: {exc}"
    if bio.tell() != len(payload):
        return f"not an Avro {name}: the datum ends at byte {bio.tell()} of {len(payload)}"
    return f"not an Avro {name}: invalid encoding at byte {bad} of {len(payload)}"


def batch_validator(p: ParsedSchema) -> Callable[[Any], tuple[int, str] | None]:
    """A function over a whole frame batch: None, or (index of the first bad message, reason).

    Avro runs in one compiled call over the frames (no object per message); other types
    validate message by message."""
    if p.schema_type == "avro":
        prog = avro_program(p)
        check_frames = _avrocheck().check_frames

        def check_avro_batch(frames_buf):
            index, bad = check_frames(prog, frames_buf)
            if index < 0:
                return None
            record = list(frame_codec.iter_records(frames_buf))[index]
            return index, _avro_reason(p, record.payload, bad)

        return check_avro_batch
    validate = payload_validator(p)

    def check_batch(frames_buf):
        for i, rec in enumerate(frame_codec.iter_records(frames_buf)):
            try:
                validate(rec.payload)
            except ValueError as exc:
                return i, str(exc)
        return None

    return check_batch


def payload_decoder(p: ParsedSchema) -> Callable[[Any], Any]:
    """A function turning a payload into a JSON-friendly value (dict for records)."""
    t = p.schema_type
    if t == "avro":
        from fastavro import schemaless_reader

        schema = p.parsed
        return lambda payload: schemaless_reader(io.BytesIO(bytes(payload)), schema, None)
    if t == "json_schema":
        return lambda payload: json.loads(bytes(payload))
    if t == "string":
        return lambda payload: bytes(payload).decode("utf-8")
    if t == "number":

        def number(payload):
            b = bytes(payload)
            if len(b) == 8:
                return int.from_bytes(b, "big", signed=True)
            return json.loads(b)

        return number
    if t == "protobuf":
        from google.protobuf import json_format, message_factory

        cls = message_factory.GetMessageClass(protobuf_main_message(p))
        return lambda payload: json_format.MessageToDict(cls.FromString(bytes(payload)))
    return lambda payload: bytes(payload)


# ---------------------------------------------------------------- the gate


@dataclass
class _Rule:
    topic: str
    subject: str
    policy: str
    payload_validation: bool
    schema_id: int | None = None
    versions: dict[int, SchemaVersion] = field(default_factory=dict)
    validators: dict[int, Callable] = field(default_factory=dict)
    batch_validators: dict[int, Callable] = field(default_factory=dict)


class SchemaGate:
    """Every topic's schema rule in memory; checks publishes against them."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry
        self.rules: dict[str, _Rule] = {}
        self.active = False  # some topic's policy is warn or enforce: publishes need checking
        self.warnings = 0  # publishes let through under ``warn`` that broke a rule
        self.refused = 0  # publishes refused under ``enforce``
        self._refresh_task: asyncio.Task | None = None
        self._watch_task: asyncio.Task | None = None
        self._dirty = False
        self._last_warn = 0.0
        registry.add_listener(self.schedule_refresh)

    async def start(self) -> None:
        await self.refresh()
        self._watch_task = asyncio.ensure_future(self._watch())

    async def stop(self) -> None:
        for task in (self._watch_task, self._refresh_task):
            if task is not None:
                task.cancel()
        for task in (self._watch_task, self._refresh_task):
            if task is not None:
                try:
                    await task
                except (asyncio.CancelledError, Exception):  # noqa: BLE001
                    pass

    async def _watch(self) -> None:
        try:
            async for _event in self.registry.metadata.watch(keys.schemas_root()):
                self.schedule_refresh()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - without a watch, this broker's own changes still refresh
            log.warning("schema registry watch ended; rules refresh on this broker's changes only", exc_info=True)

    def schedule_refresh(self) -> None:
        self._dirty = True
        if self._refresh_task is None or self._refresh_task.done():
            self._refresh_task = asyncio.ensure_future(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        while self._dirty:
            self._dirty = False
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001
                log.exception("refreshing topic schema rules failed")

    async def settled(self) -> None:
        """Returns once the refresh scheduled by this broker's registry changes has run, so a
        change made before the call is in the rules (without reading them all once more)."""
        task = self._refresh_task
        while task is not None and not task.done():
            await asyncio.wait((task,))
            task = self._refresh_task

    async def refresh(self) -> None:
        rules: dict[str, _Rule] = {}
        for cfg in await self.registry.topic_configs():
            rule = _Rule(cfg.topic, cfg.subject, cfg.validation_policy, cfg.payload_validation)
            if cfg.subject:
                try:
                    live = await self.registry.versions(cfg.subject)
                except DanubeError:
                    live = []
                if live:
                    rule.schema_id = live[0].schema_id
                rule.versions = {v.version: v for v in live}
            rules[cfg.topic] = rule
        self.rules = rules
        self.active = any(r.policy != "none" for r in rules.values())

    def rule(self, topic: str) -> _Rule | None:
        """The topic's rule; a partition ``T-part-i`` without its own falls back to ``T``'s."""
        rules = self.rules
        if not rules:
            return None
        rule = rules.get(topic)
        if rule is None:
            cut = topic.rfind("-part-")
            if cut > 0 and topic[cut + 6 :].isdigit():
                rule = rules.get(topic[:cut])
        return rule

    # ------------------------------------------------------------ checks

    def _violation(self, rule: _Rule, reason: str) -> None:
        if rule.policy == "enforce":
            self.refused += 1
            raise SchemaViolationError(
                f"topic {rule.topic} (schema subject {rule.subject!r}, policy enforce): {reason}"
            )
        self.warnings += 1
        now = time.monotonic()
        if now - self._last_warn >= _WARN_LOG_INTERVAL_S:
            self._last_warn = now
            log.warning(
                "topic %s (schema subject %r, policy warn): %s (%d such publishes so far)",
                rule.topic,
                rule.subject,
                reason,
                self.warnings,
            )

    def _check_ids(self, rule: _Rule, schema_id: int | None, schema_version: int | None) -> tuple[int, int] | None:
        """``(schema_id, schema_version)`` when the publish carries the topic's schema, else None
        (after a warning, or SchemaViolationError under ``enforce``)."""
        if schema_id is None:
            self._violation(rule, "the publish carries no schema id (produce with the topic's schema subject)")
            return None
        if rule.schema_id is None or schema_id != rule.schema_id:
            self._violation(
                rule, f"schema id {schema_id} is not the topic's (subject {rule.subject!r} has id {rule.schema_id})"
            )
            return None
        if schema_version is None or schema_version not in rule.versions:
            self._violation(
                rule,
                f"schema version {schema_version} is not a live version of subject "
                f"{rule.subject!r} (live: {sorted(rule.versions)})",
            )
            return None
        return schema_id, schema_version

    def _validator(self, rule: _Rule, version: int) -> Callable:
        v = rule.validators.get(version)
        if v is None:
            v = rule.validators[version] = payload_validator(self.registry.parsed(rule.versions[version]))
        return v

    def check_message(self, topic: str, schema_id: int | None, schema_version: int | None, payload) -> None:
        """One message (Danube's SendMessage)."""
        rule = self.rule(topic)
        if rule is None or rule.policy == "none":
            return
        ids = self._check_ids(rule, schema_id, schema_version)
        if ids is None:
            return
        if rule.payload_validation:
            schema_version = ids[1]
            try:
                self._validator(rule, schema_version)(payload)
            except ValueError as exc:
                self._violation(rule, f"payload does not match schema version {schema_version}: {exc}")

    def check_batch(self, topic: str, schema_id: int | None, schema_version: int | None, frames_buf) -> None:
        """One batch-lane batch: ids once per batch; payloads one by one only with validation on."""
        rule = self.rule(topic)
        if rule is None or rule.policy == "none":
            return
        ids = self._check_ids(rule, schema_id, schema_version)
        if ids is None:
            return
        schema_id, schema_version = ids
        # every message must carry the batch's schema (consumers and Spark decode by it): one
        # compiled pass over the frames' attributes
        bad = _avrocheck().check_attribute(frames_buf, _SCHEMA_NAME, schema_value(schema_id, schema_version).encode())
        if bad >= 0:
            self._violation(
                rule,
                f"message {bad} of the batch does not carry the batch's schema "
                f"({SCHEMA_ATTR}={schema_value(schema_id, schema_version)})",
            )
            return
        if rule.payload_validation:
            check = rule.batch_validators.get(schema_version)
            if check is None:
                check = rule.batch_validators[schema_version] = batch_validator(
                    self.registry.parsed(rule.versions[schema_version])
                )
            bad = check(frames_buf)
            if bad is not None:
                self._violation(
                    rule, f"message {bad[0]} of the batch does not match schema version {schema_version}: {bad[1]}"
                )

    async def on_create_producer(self, topic: str, subject: str) -> None:
        """A producer that names a schema subject (Danube's ``ProducerRequest.schema_ref``)."""
        await self.registry.assign_topic_subject(topic, subject)
