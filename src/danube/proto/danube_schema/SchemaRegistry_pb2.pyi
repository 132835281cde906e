from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterSchemaRequest(_message.Message):
    __slots__ = ("subject", "schema_type", "schema_definition", "description", "created_by", "tags")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_TYPE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_DEFINITION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    subject: str
    schema_type: str
    schema_definition: bytes
    description: str
    created_by: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, subject: _Optional[str] = ..., schema_type: _Optional[str] = ..., schema_definition: _Optional[bytes] = ..., description: _Optional[str] = ..., created_by: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterSchemaResponse(_message.Message):
    __slots__ = ("schema_id", "version", "is_new_version", "fingerprint")
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    IS_NEW_VERSION_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    schema_id: int
    version: int
    is_new_version: bool
    fingerprint: str
    def __init__(self, schema_id: _Optional[int] = ..., version: _Optional[int] = ..., is_new_version: _Optional[bool] = ..., fingerprint: _Optional[str] = ...) -> None: ...

class GetSchemaRequest(_message.Message):
    __slots__ = ("schema_id", "version")
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    schema_id: int
    version: int
    def __init__(self, schema_id: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class GetSchemaResponse(_message.Message):
    __slots__ = ("schema_id", "version", "subject", "schema_type", "schema_definition", "description", "created_at", "created_by", "tags", "fingerprint", "compatibility_mode")
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_TYPE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_DEFINITION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_MODE_FIELD_NUMBER: _ClassVar[int]
    schema_id: int
    version: int
    subject: str
    schema_type: str
    schema_definition: bytes
    description: str
    created_at: int
    created_by: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    fingerprint: str
    compatibility_mode: str
    def __init__(self, schema_id: _Optional[int] = ..., version: _Optional[int] = ..., subject: _Optional[str] = ..., schema_type: _Optional[str] = ..., schema_definition: _Optional[bytes] = ..., description: _Optional[str] = ..., created_at: _Optional[int] = ..., created_by: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., fingerprint: _Optional[str] = ..., compatibility_mode: _Optional[str] = ...) -> None: ...

class GetLatestSchemaRequest(_message.Message):
    __slots__ = ("subject",)
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    subject: str
    def __init__(self, subject: _Optional[str] = ...) -> None: ...

class ListVersionsRequest(_message.Message):
    __slots__ = ("subject",)
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    subject: str
    def __init__(self, subject: _Optional[str] = ...) -> None: ...

class ListVersionsResponse(_message.Message):
    __slots__ = ("versions",)
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[SchemaVersionInfo]
    def __init__(self, versions: _Optional[_Iterable[_Union[SchemaVersionInfo, _Mapping]]] = ...) -> None: ...

class SchemaVersionInfo(_message.Message):
    __slots__ = ("version", "created_at", "created_by", "description", "fingerprint", "schema_id")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    version: int
    created_at: int
    created_by: str
    description: str
    fingerprint: str
    schema_id: int
    def __init__(self, version: _Optional[int] = ..., created_at: _Optional[int] = ..., created_by: _Optional[str] = ..., description: _Optional[str] = ..., fingerprint: _Optional[str] = ..., schema_id: _Optional[int] = ...) -> None: ...

class CheckCompatibilityRequest(_message.Message):
    __slots__ = ("subject", "new_schema_definition", "schema_type", "compatibility_mode")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    NEW_SCHEMA_DEFINITION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_TYPE_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_MODE_FIELD_NUMBER: _ClassVar[int]
    subject: str
    new_schema_definition: bytes
    schema_type: str
    compatibility_mode: str
    def __init__(self, subject: _Optional[str] = ..., new_schema_definition: _Optional[bytes] = ..., schema_type: _Optional[str] = ..., compatibility_mode: _Optional[str] = ...) -> None: ...

class CheckCompatibilityResponse(_message.Message):
    __slots__ = ("is_compatible", "errors")
    IS_COMPATIBLE_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    is_compatible: bool
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, is_compatible: _Optional[bool] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteSchemaVersionRequest(_message.Message):
    __slots__ = ("subject", "version")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    subject: str
    version: int
    def __init__(self, subject: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class DeleteSchemaVersionResponse(_message.Message):
    __slots__ = ("success", "message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: str
    def __init__(self, success: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class SetCompatibilityModeRequest(_message.Message):
    __slots__ = ("subject", "compatibility_mode", "json_schema_rule")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_MODE_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_RULE_FIELD_NUMBER: _ClassVar[int]
    subject: str
    compatibility_mode: str
    json_schema_rule: str
    def __init__(self, subject: _Optional[str] = ..., compatibility_mode: _Optional[str] = ..., json_schema_rule: _Optional[str] = ...) -> None: ...

class SetCompatibilityModeResponse(_message.Message):
    __slots__ = ("success", "message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: str
    def __init__(self, success: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class ConfigureTopicSchemaRequest(_message.Message):
    __slots__ = ("topic_name", "schema_subject", "validation_policy", "enable_payload_validation")
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_POLICY_FIELD_NUMBER: _ClassVar[int]
    ENABLE_PAYLOAD_VALIDATION_FIELD_NUMBER: _ClassVar[int]
    topic_name: str
    schema_subject: str
    validation_policy: str
    enable_payload_validation: bool
    def __init__(self, topic_name: _Optional[str] = ..., schema_subject: _Optional[str] = ..., validation_policy: _Optional[str] = ..., enable_payload_validation: _Optional[bool] = ...) -> None: ...

class ConfigureTopicSchemaResponse(_message.Message):
    __slots__ = ("success", "message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: str
    def __init__(self, success: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class UpdateTopicValidationPolicyRequest(_message.Message):
    __slots__ = ("topic_name", "validation_policy", "enable_payload_validation")
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_POLICY_FIELD_NUMBER: _ClassVar[int]
    ENABLE_PAYLOAD_VALIDATION_FIELD_NUMBER: _ClassVar[int]
    topic_name: str
    validation_policy: str
    enable_payload_validation: bool
    def __init__(self, topic_name: _Optional[str] = ..., validation_policy: _Optional[str] = ..., enable_payload_validation: _Optional[bool] = ...) -> None: ...

class UpdateTopicValidationPolicyResponse(_message.Message):
    __slots__ = ("success", "message")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    success: bool
    message: str
    def __init__(self, success: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class GetTopicSchemaConfigRequest(_message.Message):
    __slots__ = ("topic_name",)
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    topic_name: str
    def __init__(self, topic_name: _Optional[str] = ...) -> None: ...

class GetTopicSchemaConfigResponse(_message.Message):
    __slots__ = ("schema_subject", "validation_policy", "enable_payload_validation", "schema_id")
    SCHEMA_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_POLICY_FIELD_NUMBER: _ClassVar[int]
    ENABLE_PAYLOAD_VALIDATION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    schema_subject: str
    validation_policy: str
    enable_payload_validation: bool
    schema_id: int
    def __init__(self, schema_subject: _Optional[str] = ..., validation_policy: _Optional[str] = ..., enable_payload_validation: _Optional[bool] = ..., schema_id: _Optional[int] = ...) -> None: ...

class ListSubjectsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SubjectSummary(_message.Message):
    __slots__ = ("subject", "schema_type", "latest_version", "compatibility_mode", "schema_id", "tags")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_TYPE_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_MODE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    subject: str
    schema_type: str
    latest_version: int
    compatibility_mode: str
    schema_id: int
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, subject: _Optional[str] = ..., schema_type: _Optional[str] = ..., latest_version: _Optional[int] = ..., compatibility_mode: _Optional[str] = ..., schema_id: _Optional[int] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class ListSubjectsResponse(_message.Message):
    __slots__ = ("subjects",)
    SUBJECTS_FIELD_NUMBER: _ClassVar[int]
    subjects: _containers.RepeatedCompositeFieldContainer[SubjectSummary]
    def __init__(self, subjects: _Optional[_Iterable[_Union[SubjectSummary, _Mapping]]] = ...) -> None: ...
