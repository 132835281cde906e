"""Schema registry errors: subclasses of the project's errors, so ``danube.server.status`` maps
them to gRPC codes without knowing about schemas (INVALID_ARGUMENT, NOT_FOUND)."""

from __future__ import annotations

from danube.errors import InvalidArgumentError, NotFoundError


class InvalidSchemaError(InvalidArgumentError):
    """A schema definition that does not parse, or an unknown schema type or mode."""


class IncompatibleSchemaError(InvalidArgumentError):
    """A new version breaks the subject's compatibility mode; ``reasons`` lists why."""

    def __init__(self, message: str, reasons: list[str] | None = None) -> None:
        super().__init__(message)
        self.reasons = list(reasons or [])


class SchemaNotFoundError(NotFoundError):
    """No such subject, schema id or version."""


class SchemaViolationError(InvalidArgumentError):
    """A publish refused by a topic's schema policy (enforce): no schema, a schema the topic
    does not allow, or a payload that does not parse under the schema."""
