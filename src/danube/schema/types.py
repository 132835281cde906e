"""Schema types: parse a definition, refuse an invalid one, give its canonical form.

| type          | definition                 | parsed with                                        |
|---------------|----------------------------|----------------------------------------------------|
| ``bytes``     | ignored (may be empty)     | nothing: any payload                               |
| ``string``    | ignored                    | payloads must be UTF-8                             |
| ``number``    | ignored                    | payloads are a JSON number in UTF-8, or 8 bytes    |
| ``avro``      | Avro schema JSON           | ``fastavro.parse_schema``                          |
| ``json_schema``| JSON Schema document      | ``jsonschema`` (the validator its ``$schema`` names, Draft 2020-12 by default), ``check_schema`` |
| ``protobuf``  | ``.proto`` text (proto2/3) | protoc from ``grpcio-tools`` (in process) → FileDescriptorSet → a ``DescriptorPool`` |

The fingerprint is the SHA-256 (hex) of the type name and the canonical form (Avro's Parsing
Canonical Form; JSON with sorted keys and no whitespace; the serialized FileDescriptorProto),
so formatting differences do not make a new version.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from array import array
from dataclasses import dataclass, field
from typing import Any

from danube.schema.errors import InvalidSchemaError

SCHEMA_TYPES = ("bytes", "string", "number", "avro", "json_schema", "protobuf")
_ALIASES = {"jsonschema": "json_schema", "json": "json_schema", "proto": "protobuf", "protobuf": "protobuf"}
COMPATIBILITY_MODES = ("none", "backward", "forward", "full")
VALIDATION_POLICIES = ("none", "warn", "enforce")


def normalize_type(schema_type: str) -> str:
    t = (schema_type or "").strip().lower()
    t = _ALIASES.get(t, t)
    if t not in SCHEMA_TYPES:
        raise InvalidSchemaError(f"unknown schema type {schema_type!r}; expected one of {', '.join(SCHEMA_TYPES)}")
    return t


def normalize_mode(mode: str) -> str:
    m = (mode or "").strip().lower()
    if m not in COMPATIBILITY_MODES:
        raise InvalidSchemaError(
            f"unknown compatibility mode {mode!r}; expected one of {', '.join(COMPATIBILITY_MODES)}"
        )
    return m


def normalize_policy(policy: str) -> str:
    p = (policy or "none").strip().lower()
    if p not in VALIDATION_POLICIES:
        raise InvalidSchemaError(f"unknown validation policy {policy!r}; expected none, warn or enforce")
    return p


@dataclass
class ParsedSchema:
    schema_type: str
    definition: bytes
    canonical: bytes
    parsed: Any = None  # fastavro schema | JSON document | (pool, FileDescriptorSet)
    named: dict = field(default_factory=dict)  # Avro named types by full name
    # The compiled payload checker of an Avro schema, built on first use (validation.avro_program).
    _avro_program: array | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.schema_type.encode() + b"\n" + self.canonical).hexdigest()


def parse(schema_type: str, definition: bytes | str) -> ParsedSchema:
    """Parse and check ``definition``; raises InvalidSchemaError with the parser's reason."""
    t = normalize_type(schema_type)
    if isinstance(definition, str):
        definition = definition.encode()
    definition = bytes(definition or b"")
    if t in ("bytes", "string", "number"):
        return ParsedSchema(t, definition, b"")
    if not definition.strip():
        raise InvalidSchemaError(f"a {t} schema needs a definition")
    if t == "avro":
        return _parse_avro(definition)
    if t == "json_schema":
        return _parse_json_schema(definition)
    return _parse_protobuf(definition)


def _json_doc(definition: bytes, what: str) -> Any:
    try:
        return json.loads(definition)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidSchemaError(f"invalid {what} schema: not JSON: {exc}") from None


def _parse_avro(definition: bytes) -> ParsedSchema:
    from fastavro.schema import SchemaParseException, parse_schema, to_parsing_canonical_form

    doc = _json_doc(definition, "avro")
    named: dict = {}
    try:
        parsed = parse_schema(doc, named_schemas=named, _write_hint=False)
        canonical = to_parsing_canonical_form(doc)
    except (SchemaParseException, ValueError, TypeError, KeyError, AttributeError) as exc:
        if type(exc).__name__ == "UnknownType":
            raise InvalidSchemaError(f"invalid avro schema: unknown type {str(exc)!r}") from None
        raise InvalidSchemaError(f"invalid avro schema: {type(exc).__name__}: {exc}") from None
    return ParsedSchema("avro", definition, canonical.encode(), parsed, named)


def _parse_json_schema(definition: bytes) -> ParsedSchema:
    import jsonschema
    from jsonschema.exceptions import SchemaError

    doc = _json_doc(definition, "json_schema")
    if not isinstance(doc, (dict, bool)):
        raise InvalidSchemaError("invalid json_schema schema: a JSON Schema is an object or a boolean")
    try:
        cls = jsonschema.validators.validator_for(doc, default=jsonschema.Draft202012Validator)
        cls.check_schema(doc)
    except SchemaError as exc:
        raise InvalidSchemaError(
            f"invalid json_schema schema: {exc.message} (at {'/'.join(map(str, exc.path)) or 'root'})"
        ) from None
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return ParsedSchema("json_schema", definition, canonical, doc)


def _protoc_include() -> str:
    import importlib.resources

    return str(importlib.resources.files("grpc_tools") / "_proto")


def _parse_protobuf(definition: bytes) -> ParsedSchema:
    """``.proto`` text → FileDescriptorSet (protoc in process, well-known imports allowed) → a pool."""
    try:
        from grpc_tools import protoc
    except ImportError:  # pragma: no cover - grpcio-tools is a dependency
        raise InvalidSchemaError("protobuf schemas need grpcio-tools (protoc) installed") from None
    from google.protobuf import descriptor_pb2, descriptor_pool

    try:
        text = definition.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidSchemaError("invalid protobuf schema: .proto text must be UTF-8") from None
    with tempfile.TemporaryDirectory(prefix="danube-proto-") as tmp:
        src = os.path.join(tmp, "schema.proto")
        out = os.path.join(tmp, "schema.desc")
        with open(src, "w", encoding="utf-8") as f:
            f.write(text)
        errors_path = os.path.join(tmp, "errors.txt")
        # protoc writes its diagnostics to fd 2; capture them for the error message.
        saved = os.dup(2)
        with open(errors_path, "w") as err:
            os.dup2(err.fileno(), 2)
            try:
                rc = protoc.main(
                    [
                        "protoc",
                        f"-I{tmp}",
                        f"-I{_protoc_include()}",
                        "--include_imports",
                        f"--descriptor_set_out={out}",
                        src,
                    ]
                )
            finally:
                os.dup2(saved, 2)
                os.close(saved)
        if rc != 0:
            with open(errors_path) as err:
                reason = " ".join(line.replace(tmp + "/", "").strip() for line in err if line.strip())
            raise InvalidSchemaError(f"invalid protobuf schema: {reason or 'protoc refused it'}")
        with open(out, "rb") as f:
            fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    try:
        for fd in fds.file:
            pool.Add(fd)
    except Exception as exc:  # noqa: BLE001 - the pool's own complaint
        raise InvalidSchemaError(f"invalid protobuf schema: {exc}") from None
    main = fds.file[-1]
    if not main.message_type:
        raise InvalidSchemaError("invalid protobuf schema: it declares no message")
    canonical = main.SerializeToString(deterministic=True)
    return ParsedSchema("protobuf", definition, canonical, (pool, main))


def protobuf_main_message(parsed: ParsedSchema):
    """The descriptor of a protobuf schema's message: the first message the file declares."""
    pool, main = parsed.parsed
    name = f"{main.package}.{main.message_type[0].name}" if main.package else main.message_type[0].name
    return pool.FindMessageTypeByName(name)
