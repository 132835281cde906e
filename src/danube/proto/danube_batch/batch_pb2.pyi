from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AccessMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARED: _ClassVar[AccessMode]
    EXCLUSIVE: _ClassVar[AccessMode]

class SubscriptionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXCLUSIVE_SUBSCRIPTION: _ClassVar[SubscriptionType]
    SHARED_SUBSCRIPTION: _ClassVar[SubscriptionType]
    FAILOVER_SUBSCRIPTION: _ClassVar[SubscriptionType]
    KEY_SHARED_SUBSCRIPTION: _ClassVar[SubscriptionType]

class InitialPosition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LATEST: _ClassVar[InitialPosition]
    EARLIEST: _ClassVar[InitialPosition]
SHARED: AccessMode
EXCLUSIVE: AccessMode
EXCLUSIVE_SUBSCRIPTION: SubscriptionType
SHARED_SUBSCRIPTION: SubscriptionType
FAILOVER_SUBSCRIPTION: SubscriptionType
KEY_SHARED_SUBSCRIPTION: SubscriptionType
LATEST: InitialPosition
EARLIEST: InitialPosition

class BatchStatus(_message.Message):
    __slots__ = ("code", "message", "retriable", "partitioning_version", "partitions", "redirect_url")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRIABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONING_VERSION_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_URL_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    retriable: bool
    partitioning_version: int
    partitions: int
    redirect_url: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., retriable: _Optional[bool] = ..., partitioning_version: _Optional[int] = ..., partitions: _Optional[int] = ..., redirect_url: _Optional[str] = ...) -> None: ...

class ProducerSpec(_message.Message):
    __slots__ = ("topic", "producer_name", "access_mode", "reliable", "schema_subject")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    ACCESS_MODE_FIELD_NUMBER: _ClassVar[int]
    RELIABLE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    producer_name: str
    access_mode: AccessMode
    reliable: bool
    schema_subject: str
    def __init__(self, topic: _Optional[str] = ..., producer_name: _Optional[str] = ..., access_mode: _Optional[_Union[AccessMode, str]] = ..., reliable: _Optional[bool] = ..., schema_subject: _Optional[str] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("sequence", "producer_id", "create", "frames", "partitioning_version", "schema_id", "schema_version")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    PARTITIONING_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    producer_id: int
    create: ProducerSpec
    frames: bytes
    partitioning_version: int
    schema_id: int
    schema_version: int
    def __init__(self, sequence: _Optional[int] = ..., producer_id: _Optional[int] = ..., create: _Optional[_Union[ProducerSpec, _Mapping]] = ..., frames: _Optional[bytes] = ..., partitioning_version: _Optional[int] = ..., schema_id: _Optional[int] = ..., schema_version: _Optional[int] = ...) -> None: ...

class PublishAck(_message.Message):
    __slots__ = ("sequence", "producer_id", "first_offset", "last_offset", "count", "status")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    producer_id: int
    first_offset: int
    last_offset: int
    count: int
    status: BatchStatus
    def __init__(self, sequence: _Optional[int] = ..., producer_id: _Optional[int] = ..., first_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., count: _Optional[int] = ..., status: _Optional[_Union[BatchStatus, _Mapping]] = ...) -> None: ...

class CreateProducerResponse(_message.Message):
    __slots__ = ("producer_id",)
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    def __init__(self, producer_id: _Optional[int] = ...) -> None: ...

class SubscribeSpec(_message.Message):
    __slots__ = ("topic", "subscription", "consumer_name", "subscription_type", "key_filters", "reliable", "initial_position")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_NAME_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FILTERS_FIELD_NUMBER: _ClassVar[int]
    RELIABLE_FIELD_NUMBER: _ClassVar[int]
    INITIAL_POSITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    consumer_name: str
    subscription_type: SubscriptionType
    key_filters: _containers.RepeatedScalarFieldContainer[str]
    reliable: bool
    initial_position: InitialPosition
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., consumer_name: _Optional[str] = ..., subscription_type: _Optional[_Union[SubscriptionType, str]] = ..., key_filters: _Optional[_Iterable[str]] = ..., reliable: _Optional[bool] = ..., initial_position: _Optional[_Union[InitialPosition, str]] = ...) -> None: ...

class Credit(_message.Message):
    __slots__ = ("messages", "bytes")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    messages: int
    bytes: int
    def __init__(self, messages: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class OffsetRange(_message.Message):
    __slots__ = ("first", "last")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class AckBatch(_message.Message):
    __slots__ = ("consumer_id", "ranges")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    consumer_id: int
    ranges: _containers.RepeatedCompositeFieldContainer[OffsetRange]
    def __init__(self, consumer_id: _Optional[int] = ..., ranges: _Optional[_Iterable[_Union[OffsetRange, _Mapping]]] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("consumer_id", "offset", "delay_ms", "reason")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    consumer_id: int
    offset: int
    delay_ms: int
    reason: str
    def __init__(self, consumer_id: _Optional[int] = ..., offset: _Optional[int] = ..., delay_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("subscribe", "consumer_id", "credit", "ack", "nack")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    subscribe: SubscribeSpec
    consumer_id: int
    credit: Credit
    ack: AckBatch
    nack: NackRequest
    def __init__(self, subscribe: _Optional[_Union[SubscribeSpec, _Mapping]] = ..., consumer_id: _Optional[int] = ..., credit: _Optional[_Union[Credit, _Mapping]] = ..., ack: _Optional[_Union[AckBatch, _Mapping]] = ..., nack: _Optional[_Union[NackRequest, _Mapping]] = ...) -> None: ...

class Subscribed(_message.Message):
    __slots__ = ("consumer_id",)
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    consumer_id: int
    def __init__(self, consumer_id: _Optional[int] = ...) -> None: ...

class ConsumeBatch(_message.Message):
    __slots__ = ("frames", "first_offset", "last_offset", "count", "redelivery_counts")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_COUNTS_FIELD_NUMBER: _ClassVar[int]
    frames: bytes
    first_offset: int
    last_offset: int
    count: int
    redelivery_counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, frames: _Optional[bytes] = ..., first_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., count: _Optional[int] = ..., redelivery_counts: _Optional[_Iterable[int]] = ...) -> None: ...

class ConsumeResponse(_message.Message):
    __slots__ = ("subscribed", "batch", "error")
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    subscribed: Subscribed
    batch: ConsumeBatch
    error: BatchStatus
    def __init__(self, subscribed: _Optional[_Union[Subscribed, _Mapping]] = ..., batch: _Optional[_Union[ConsumeBatch, _Mapping]] = ..., error: _Optional[_Union[BatchStatus, _Mapping]] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PartitionOwner(_message.Message):
    __slots__ = ("index", "broker_url")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    BROKER_URL_FIELD_NUMBER: _ClassVar[int]
    index: int
    broker_url: str
    def __init__(self, index: _Optional[int] = ..., broker_url: _Optional[str] = ...) -> None: ...

class TopicRouting(_message.Message):
    __slots__ = ("topic", "partitions", "partitioning_version", "owners", "in_transition", "live_partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONING_VERSION_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    IN_TRANSITION_FIELD_NUMBER: _ClassVar[int]
    LIVE_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: int
    partitioning_version: int
    owners: _containers.RepeatedCompositeFieldContainer[PartitionOwner]
    in_transition: bool
    live_partitions: int
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[int] = ..., partitioning_version: _Optional[int] = ..., owners: _Optional[_Iterable[_Union[PartitionOwner, _Mapping]]] = ..., in_transition: _Optional[bool] = ..., live_partitions: _Optional[int] = ...) -> None: ...

class TopologyRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class Topology(_message.Message):
    __slots__ = ("generation", "topics")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    generation: int
    topics: _containers.RepeatedCompositeFieldContainer[TopicRouting]
    def __init__(self, generation: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[TopicRouting, _Mapping]]] = ...) -> None: ...

class TopologyAck(_message.Message):
    __slots__ = ("generation",)
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    def __init__(self, generation: _Optional[int] = ...) -> None: ...

class TopologyStreamRequest(_message.Message):
    __slots__ = ("subscribe", "ack")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    subscribe: TopologyRequest
    ack: TopologyAck
    def __init__(self, subscribe: _Optional[_Union[TopologyRequest, _Mapping]] = ..., ack: _Optional[_Union[TopologyAck, _Mapping]] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ("producer_ids", "consumer_ids")
    PRODUCER_IDS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_IDS_FIELD_NUMBER: _ClassVar[int]
    producer_ids: _containers.RepeatedScalarFieldContainer[int]
    consumer_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, producer_ids: _Optional[_Iterable[int]] = ..., consumer_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("closed_producer_ids", "closed_consumer_ids")
    CLOSED_PRODUCER_IDS_FIELD_NUMBER: _ClassVar[int]
    CLOSED_CONSUMER_IDS_FIELD_NUMBER: _ClassVar[int]
    closed_producer_ids: _containers.RepeatedScalarFieldContainer[int]
    closed_consumer_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, closed_producer_ids: _Optional[_Iterable[int]] = ..., closed_consumer_ids: _Optional[_Iterable[int]] = ...) -> None: ...
