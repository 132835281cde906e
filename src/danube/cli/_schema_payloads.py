"""Schema-aware payloads for `danube produce --schema-subject` and `danube consume --print`.

Produce: the ``--message`` text is a JSON document; for an Avro subject it is encoded with the
subject's schema (fastavro), for a JSON Schema subject it is validated and sent as JSON; other
types send the text as it is.  Consume: a message carrying a schema id and version (the frame
attribute ``danube.schema`` = "id:version") is decoded with that version and
printed as one line of JSON; other messages print as UTF-8 text.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any, Callable

from danube.errors import InvalidArgumentError
from danube.schema.types import parse
from danube.schema.validation import SCHEMA_ATTR, parse_schema_value, payload_decoder, payload_validator


class SchemaPayloadError(InvalidArgumentError):
    pass


def encode_message(info, text: str) -> bytes:
    """``text`` (JSON for Avro and JSON Schema) as a payload of the schema ``info`` describes."""
    parsed = parse(info.schema_type, info.schema_definition)
    if parsed.schema_type == "avro":
        from fastavro import schemaless_writer

        try:
            record = json.loads(text)
            out = io.BytesIO()
            schemaless_writer(out, parsed.parsed, record)
        except Exception as exc:  # noqa: BLE001 - report the record that did not fit
            raise SchemaPayloadError(
                f"--message does not fit Avro schema {info.subject} v{info.version}: {exc}"
            ) from None
        return out.getvalue()
    payload = text.encode()
    try:
        payload_validator(parsed)(payload)
    except ValueError as exc:
        raise SchemaPayloadError(f"--message does not fit schema {info.subject} v{info.version}: {exc}") from None
    return payload


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    return str(value)


class PayloadPrinter:
    """``await printer.text(message)``: decoded JSON for schema'd messages, else UTF-8 text."""

    def __init__(self, client) -> None:
        self._client = client
        self._decoders: dict[tuple[int, int], Callable | None] = {}

    async def _decoder(self, schema_id: int, version: int):
        key = (schema_id, version)
        if key not in self._decoders:
            from danube.client.schema import SchemaRegistryClient

            try:
                info = await SchemaRegistryClient(self._client).get(schema_id, version)
                parsed = parse(info.schema_type, info.schema_definition)
                self._decoders[key] = (
                    payload_decoder(parsed)
                    if parsed.schema_type in ("avro", "json_schema", "protobuf", "number")
                    else None
                )
            except Exception:  # noqa: BLE001 - unknown schema: print the raw text
                self._decoders[key] = None
        return self._decoders[key]

    async def text(self, message) -> str:
        attrs = message.attributes or {}
        sid, ver = parse_schema_value(attrs.get(SCHEMA_ATTR))
        if sid is not None and ver is not None:
            decode = await self._decoder(int(sid), int(ver))
            if decode is not None:
                try:
                    return json.dumps(decode(message.payload), default=_jsonable, separators=(",", ":"))
                except Exception:  # noqa: BLE001 - a payload that does not decode prints raw
                    pass
        return message.payload.decode("utf-8", "replace")
