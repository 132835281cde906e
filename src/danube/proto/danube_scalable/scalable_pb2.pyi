from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SegmentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTIVE: _ClassVar[SegmentState]
    SEALED: _ClassVar[SegmentState]
ACTIVE: SegmentState
SEALED: SegmentState

class HashRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class SegmentInfoProto(_message.Message):
    __slots__ = ("segment_id", "hash_range", "state", "parent_ids", "child_ids", "created_at_epoch", "sealed_at_epoch", "topic_name")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    HASH_RANGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PARENT_IDS_FIELD_NUMBER: _ClassVar[int]
    CHILD_IDS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEALED_AT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    hash_range: HashRange
    state: SegmentState
    parent_ids: _containers.RepeatedScalarFieldContainer[int]
    child_ids: _containers.RepeatedScalarFieldContainer[int]
    created_at_epoch: int
    sealed_at_epoch: int
    topic_name: str
    def __init__(self, segment_id: _Optional[int] = ..., hash_range: _Optional[_Union[HashRange, _Mapping]] = ..., state: _Optional[_Union[SegmentState, str]] = ..., parent_ids: _Optional[_Iterable[int]] = ..., child_ids: _Optional[_Iterable[int]] = ..., created_at_epoch: _Optional[int] = ..., sealed_at_epoch: _Optional[int] = ..., topic_name: _Optional[str] = ...) -> None: ...

class SegmentBrokerAddress(_message.Message):
    __slots__ = ("segment_id", "broker_url")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_URL_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    broker_url: str
    def __init__(self, segment_id: _Optional[int] = ..., broker_url: _Optional[str] = ...) -> None: ...

class ScalableTopicDAG(_message.Message):
    __slots__ = ("epoch", "segments", "segment_brokers", "controller_broker_url", "controller_broker_url_tls", "metadata_json", "deleted")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_BROKERS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_BROKER_URL_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_BROKER_URL_TLS_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    segments: _containers.RepeatedCompositeFieldContainer[SegmentInfoProto]
    segment_brokers: _containers.RepeatedCompositeFieldContainer[SegmentBrokerAddress]
    controller_broker_url: str
    controller_broker_url_tls: str
    metadata_json: str
    deleted: bool
    def __init__(self, epoch: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[SegmentInfoProto, _Mapping]]] = ..., segment_brokers: _Optional[_Iterable[_Union[SegmentBrokerAddress, _Mapping]]] = ..., controller_broker_url: _Optional[str] = ..., controller_broker_url_tls: _Optional[str] = ..., metadata_json: _Optional[str] = ..., deleted: _Optional[bool] = ...) -> None: ...

class ScalableTopicLookup(_message.Message):
    __slots__ = ("session_id", "topic")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    topic: str
    def __init__(self, session_id: _Optional[int] = ..., topic: _Optional[str] = ...) -> None: ...

class ScalableTopicUpdate(_message.Message):
    __slots__ = ("session_id", "dag")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DAG_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    dag: ScalableTopicDAG
    def __init__(self, session_id: _Optional[int] = ..., dag: _Optional[_Union[ScalableTopicDAG, _Mapping]] = ...) -> None: ...

class CreateScalableTopicRequest(_message.Message):
    __slots__ = ("topic", "num_segments")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NUM_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    num_segments: int
    def __init__(self, topic: _Optional[str] = ..., num_segments: _Optional[int] = ...) -> None: ...

class ScalableTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class SplitSegmentRequest(_message.Message):
    __slots__ = ("topic", "segment_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    segment_id: int
    def __init__(self, topic: _Optional[str] = ..., segment_id: _Optional[int] = ...) -> None: ...

class MergeSegmentsRequest(_message.Message):
    __slots__ = ("topic", "segment_id1", "segment_id2")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID1_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID2_FIELD_NUMBER: _ClassVar[int]
    topic: str
    segment_id1: int
    segment_id2: int
    def __init__(self, topic: _Optional[str] = ..., segment_id1: _Optional[int] = ..., segment_id2: _Optional[int] = ...) -> None: ...

class LayoutResponse(_message.Message):
    __slots__ = ("metadata_json", "controller_broker_url")
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_BROKER_URL_FIELD_NUMBER: _ClassVar[int]
    metadata_json: str
    controller_broker_url: str
    def __init__(self, metadata_json: _Optional[str] = ..., controller_broker_url: _Optional[str] = ...) -> None: ...

class JsonResponse(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class ListScalableTopicsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class ListScalableTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class DeletedResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class ScalableSubscriptionRequest(_message.Message):
    __slots__ = ("topic", "subscription", "type")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    type: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., type: _Optional[str] = ...) -> None: ...

class RegisterConsumerRequest(_message.Message):
    __slots__ = ("topic", "subscription", "consumer_name", "consumer_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_NAME_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    consumer_name: str
    consumer_id: int
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., consumer_name: _Optional[str] = ..., consumer_id: _Optional[int] = ...) -> None: ...

class AssignmentUpdate(_message.Message):
    __slots__ = ("assignment_json",)
    ASSIGNMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    assignment_json: str
    def __init__(self, assignment_json: _Optional[str] = ...) -> None: ...

class SegmentDrainedRequest(_message.Message):
    __slots__ = ("topic", "subscription", "segment_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    segment_id: int
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., segment_id: _Optional[int] = ...) -> None: ...

class SegmentRequest(_message.Message):
    __slots__ = ("segment_topic", "subscriptions", "subscription")
    class SubscriptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEGMENT_TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    segment_topic: str
    subscriptions: _containers.ScalarMap[str, str]
    subscription: str
    def __init__(self, segment_topic: _Optional[str] = ..., subscriptions: _Optional[_Mapping[str, str]] = ..., subscription: _Optional[str] = ...) -> None: ...

class StoredMessagesRequest(_message.Message):
    __slots__ = ("segment_topic", "producer_id", "after_offset", "since_publish_time")
    SEGMENT_TOPIC_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SINCE_PUBLISH_TIME_FIELD_NUMBER: _ClassVar[int]
    segment_topic: str
    producer_id: int
    after_offset: int
    since_publish_time: int
    def __init__(self, segment_topic: _Optional[str] = ..., producer_id: _Optional[int] = ..., after_offset: _Optional[int] = ..., since_publish_time: _Optional[int] = ...) -> None: ...

class StoredMessagesResponse(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, offsets: _Optional[_Iterable[int]] = ...) -> None: ...
