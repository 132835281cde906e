from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DispatchStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NonReliable: _ClassVar[DispatchStrategy]
    Reliable: _ClassVar[DispatchStrategy]

class SubscriptionBackoffStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    Fixed: _ClassVar[SubscriptionBackoffStrategy]
    Exponential: _ClassVar[SubscriptionBackoffStrategy]

class SubscriptionPoisonPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DeadLetter: _ClassVar[SubscriptionPoisonPolicy]
    Block: _ClassVar[SubscriptionPoisonPolicy]
    Drop: _ClassVar[SubscriptionPoisonPolicy]
NonReliable: DispatchStrategy
Reliable: DispatchStrategy
Fixed: SubscriptionBackoffStrategy
Exponential: SubscriptionBackoffStrategy
DeadLetter: SubscriptionPoisonPolicy
Block: SubscriptionPoisonPolicy
Drop: SubscriptionPoisonPolicy

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NamespaceRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class TopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class BrokerRequest(_message.Message):
    __slots__ = ("broker_id",)
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    def __init__(self, broker_id: _Optional[str] = ...) -> None: ...

class DescribeTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class NewTopicRequest(_message.Message):
    __slots__ = ("name", "schema_subject", "dispatch_strategy")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    name: str
    schema_subject: str
    dispatch_strategy: DispatchStrategy
    def __init__(self, name: _Optional[str] = ..., schema_subject: _Optional[str] = ..., dispatch_strategy: _Optional[_Union[DispatchStrategy, str]] = ...) -> None: ...

class PartitionedTopicRequest(_message.Message):
    __slots__ = ("base_name", "partitions", "schema_subject", "dispatch_strategy")
    BASE_NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    base_name: str
    partitions: int
    schema_subject: str
    dispatch_strategy: DispatchStrategy
    def __init__(self, base_name: _Optional[str] = ..., partitions: _Optional[int] = ..., schema_subject: _Optional[str] = ..., dispatch_strategy: _Optional[_Union[DispatchStrategy, str]] = ...) -> None: ...

class SubscriptionRequest(_message.Message):
    __slots__ = ("topic", "subscription")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class SubscriptionFailurePolicy(_message.Message):
    __slots__ = ("max_redelivery_count", "ack_timeout_ms", "base_redelivery_delay_ms", "max_redelivery_delay_ms", "backoff_strategy", "dead_letter_topic", "poison_policy")
    MAX_REDELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    ACK_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    BASE_REDELIVERY_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_REDELIVERY_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    POISON_POLICY_FIELD_NUMBER: _ClassVar[int]
    max_redelivery_count: int
    ack_timeout_ms: int
    base_redelivery_delay_ms: int
    max_redelivery_delay_ms: int
    backoff_strategy: SubscriptionBackoffStrategy
    dead_letter_topic: str
    poison_policy: SubscriptionPoisonPolicy
    def __init__(self, max_redelivery_count: _Optional[int] = ..., ack_timeout_ms: _Optional[int] = ..., base_redelivery_delay_ms: _Optional[int] = ..., max_redelivery_delay_ms: _Optional[int] = ..., backoff_strategy: _Optional[_Union[SubscriptionBackoffStrategy, str]] = ..., dead_letter_topic: _Optional[str] = ..., poison_policy: _Optional[_Union[SubscriptionPoisonPolicy, str]] = ...) -> None: ...

class SetSubscriptionFailurePolicyRequest(_message.Message):
    __slots__ = ("topic", "subscription", "failure_policy")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    FAILURE_POLICY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    failure_policy: SubscriptionFailurePolicy
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., failure_policy: _Optional[_Union[SubscriptionFailurePolicy, _Mapping]] = ...) -> None: ...

class GetSubscriptionFailurePolicyRequest(_message.Message):
    __slots__ = ("topic", "subscription")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class UnloadBrokerRequest(_message.Message):
    __slots__ = ("broker_id", "max_parallel", "namespaces_include", "namespaces_exclude", "dry_run", "timeout_seconds")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_INCLUDE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    max_parallel: int
    namespaces_include: _containers.RepeatedScalarFieldContainer[str]
    namespaces_exclude: _containers.RepeatedScalarFieldContainer[str]
    dry_run: bool
    timeout_seconds: int
    def __init__(self, broker_id: _Optional[str] = ..., max_parallel: _Optional[int] = ..., namespaces_include: _Optional[_Iterable[str]] = ..., namespaces_exclude: _Optional[_Iterable[str]] = ..., dry_run: _Optional[bool] = ..., timeout_seconds: _Optional[int] = ...) -> None: ...

class ActivateBrokerRequest(_message.Message):
    __slots__ = ("broker_id", "reason")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    reason: str
    def __init__(self, broker_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ClusterBalanceRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RebalanceRequest(_message.Message):
    __slots__ = ("dry_run", "max_moves")
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    MAX_MOVES_FIELD_NUMBER: _ClassVar[int]
    dry_run: bool
    max_moves: int
    def __init__(self, dry_run: _Optional[bool] = ..., max_moves: _Optional[int] = ...) -> None: ...

class RebalancingHistoryRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class NamespaceResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class TopicResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class SubscriptionResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class PolicyResponse(_message.Message):
    __slots__ = ("policies",)
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    policies: str
    def __init__(self, policies: _Optional[str] = ...) -> None: ...

class GetSubscriptionFailurePolicyResponse(_message.Message):
    __slots__ = ("failure_policy", "subscription_type")
    FAILURE_POLICY_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    failure_policy: SubscriptionFailurePolicy
    subscription_type: int
    def __init__(self, failure_policy: _Optional[_Union[SubscriptionFailurePolicy, _Mapping]] = ..., subscription_type: _Optional[int] = ...) -> None: ...

class BrokerResponse(_message.Message):
    __slots__ = ("leader",)
    LEADER_FIELD_NUMBER: _ClassVar[int]
    leader: str
    def __init__(self, leader: _Optional[str] = ...) -> None: ...

class NamespaceListResponse(_message.Message):
    __slots__ = ("namespaces",)
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespaces: _Optional[_Iterable[str]] = ...) -> None: ...

class TopicListResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class SubscriptionListResponse(_message.Message):
    __slots__ = ("subscriptions",)
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, subscriptions: _Optional[_Iterable[str]] = ...) -> None: ...

class BrokerInfo(_message.Message):
    __slots__ = ("broker_id", "broker_addr", "broker_role", "admin_addr", "metrics_addr", "broker_status")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_ADDR_FIELD_NUMBER: _ClassVar[int]
    BROKER_ROLE_FIELD_NUMBER: _ClassVar[int]
    ADMIN_ADDR_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDR_FIELD_NUMBER: _ClassVar[int]
    BROKER_STATUS_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    broker_addr: str
    broker_role: str
    admin_addr: str
    metrics_addr: str
    broker_status: str
    def __init__(self, broker_id: _Optional[str] = ..., broker_addr: _Optional[str] = ..., broker_role: _Optional[str] = ..., admin_addr: _Optional[str] = ..., metrics_addr: _Optional[str] = ..., broker_status: _Optional[str] = ...) -> None: ...

class BrokerListResponse(_message.Message):
    __slots__ = ("brokers",)
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerInfo]
    def __init__(self, brokers: _Optional[_Iterable[_Union[BrokerInfo, _Mapping]]] = ...) -> None: ...

class TopicInfo(_message.Message):
    __slots__ = ("name", "broker_id", "delivery")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    name: str
    broker_id: str
    delivery: str
    def __init__(self, name: _Optional[str] = ..., broker_id: _Optional[str] = ..., delivery: _Optional[str] = ...) -> None: ...

class TopicInfoListResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ...) -> None: ...

class SegmentInfo(_message.Message):
    __slots__ = ("segment_id", "start_offset", "end_offset", "size", "record_count")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    RECORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    start_offset: int
    end_offset: int
    size: int
    record_count: int
    def __init__(self, segment_id: _Optional[str] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., size: _Optional[int] = ..., record_count: _Optional[int] = ...) -> None: ...

class StorageInfo(_message.Message):
    __slots__ = ("mode", "first_offset", "next_offset", "hot_start_offset", "durable_end_offset", "segment_count", "segment_bytes", "segments", "recovered_from", "backend")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HOT_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DURABLE_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_FROM_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    mode: str
    first_offset: int
    next_offset: int
    hot_start_offset: int
    durable_end_offset: int
    segment_count: int
    segment_bytes: int
    segments: _containers.RepeatedCompositeFieldContainer[SegmentInfo]
    recovered_from: str
    backend: str
    def __init__(self, mode: _Optional[str] = ..., first_offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., hot_start_offset: _Optional[int] = ..., durable_end_offset: _Optional[int] = ..., segment_count: _Optional[int] = ..., segment_bytes: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[SegmentInfo, _Mapping]]] = ..., recovered_from: _Optional[str] = ..., backend: _Optional[str] = ...) -> None: ...

class DescribeTopicResponse(_message.Message):
    __slots__ = ("name", "subscriptions", "broker_id", "delivery", "schema_subject", "schema_id", "schema_version", "schema_type", "compatibility_mode", "storage")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_TYPE_FIELD_NUMBER: _ClassVar[int]
    COMPATIBILITY_MODE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    subscriptions: _containers.RepeatedScalarFieldContainer[str]
    broker_id: str
    delivery: str
    schema_subject: str
    schema_id: int
    schema_version: int
    schema_type: str
    compatibility_mode: str
    storage: StorageInfo
    def __init__(self, name: _Optional[str] = ..., subscriptions: _Optional[_Iterable[str]] = ..., broker_id: _Optional[str] = ..., delivery: _Optional[str] = ..., schema_subject: _Optional[str] = ..., schema_id: _Optional[int] = ..., schema_version: _Optional[int] = ..., schema_type: _Optional[str] = ..., compatibility_mode: _Optional[str] = ..., storage: _Optional[_Union[StorageInfo, _Mapping]] = ...) -> None: ...

class UnloadBrokerResponse(_message.Message):
    __slots__ = ("started", "total", "succeeded", "failed", "pending", "failed_topics")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    FAILED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    started: bool
    total: int
    succeeded: int
    failed: int
    pending: int
    failed_topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, started: _Optional[bool] = ..., total: _Optional[int] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., pending: _Optional[int] = ..., failed_topics: _Optional[_Iterable[str]] = ...) -> None: ...

class ActivateBrokerResponse(_message.Message):
    __slots__ = ("success",)
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    def __init__(self, success: _Optional[bool] = ...) -> None: ...

class BrokerLoad(_message.Message):
    __slots__ = ("broker_id", "load", "topic_count")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    TOPIC_COUNT_FIELD_NUMBER: _ClassVar[int]
    broker_id: str
    load: float
    topic_count: int
    def __init__(self, broker_id: _Optional[str] = ..., load: _Optional[float] = ..., topic_count: _Optional[int] = ...) -> None: ...

class ClusterBalanceResponse(_message.Message):
    __slots__ = ("coefficient_of_variation", "mean_load", "max_load", "min_load", "std_deviation", "brokers", "active_brokers", "cv_threshold", "overloaded", "underloaded", "strategy")
    COEFFICIENT_OF_VARIATION_FIELD_NUMBER: _ClassVar[int]
    MEAN_LOAD_FIELD_NUMBER: _ClassVar[int]
    MAX_LOAD_FIELD_NUMBER: _ClassVar[int]
    MIN_LOAD_FIELD_NUMBER: _ClassVar[int]
    STD_DEVIATION_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_BROKERS_FIELD_NUMBER: _ClassVar[int]
    CV_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    OVERLOADED_FIELD_NUMBER: _ClassVar[int]
    UNDERLOADED_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    coefficient_of_variation: float
    mean_load: float
    max_load: float
    min_load: float
    std_deviation: float
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerLoad]
    active_brokers: int
    cv_threshold: float
    overloaded: _containers.RepeatedScalarFieldContainer[str]
    underloaded: _containers.RepeatedScalarFieldContainer[str]
    strategy: str
    def __init__(self, coefficient_of_variation: _Optional[float] = ..., mean_load: _Optional[float] = ..., max_load: _Optional[float] = ..., min_load: _Optional[float] = ..., std_deviation: _Optional[float] = ..., brokers: _Optional[_Iterable[_Union[BrokerLoad, _Mapping]]] = ..., active_brokers: _Optional[int] = ..., cv_threshold: _Optional[float] = ..., overloaded: _Optional[_Iterable[str]] = ..., underloaded: _Optional[_Iterable[str]] = ..., strategy: _Optional[str] = ...) -> None: ...

class ProposedMove(_message.Message):
    __slots__ = ("topic_name", "from_broker", "to_broker", "estimated_load")
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    FROM_BROKER_FIELD_NUMBER: _ClassVar[int]
    TO_BROKER_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_LOAD_FIELD_NUMBER: _ClassVar[int]
    topic_name: str
    from_broker: str
    to_broker: str
    estimated_load: float
    def __init__(self, topic_name: _Optional[str] = ..., from_broker: _Optional[str] = ..., to_broker: _Optional[str] = ..., estimated_load: _Optional[float] = ...) -> None: ...

class RebalanceResponse(_message.Message):
    __slots__ = ("success", "moves_executed", "proposed_moves", "message", "cv_before", "cv_after_estimated")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MOVES_EXECUTED_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_MOVES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CV_BEFORE_FIELD_NUMBER: _ClassVar[int]
    CV_AFTER_ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    success: bool
    moves_executed: int
    proposed_moves: _containers.RepeatedCompositeFieldContainer[ProposedMove]
    message: str
    cv_before: float
    cv_after_estimated: float
    def __init__(self, success: _Optional[bool] = ..., moves_executed: _Optional[int] = ..., proposed_moves: _Optional[_Iterable[_Union[ProposedMove, _Mapping]]] = ..., message: _Optional[str] = ..., cv_before: _Optional[float] = ..., cv_after_estimated: _Optional[float] = ...) -> None: ...

class RebalancingMove(_message.Message):
    __slots__ = ("topic_name", "from_broker", "to_broker", "reason", "estimated_load", "timestamp", "planned_to_broker", "cv_before", "cv_after_estimated", "strategy", "outcome")
    TOPIC_NAME_FIELD_NUMBER: _ClassVar[int]
    FROM_BROKER_FIELD_NUMBER: _ClassVar[int]
    TO_BROKER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_LOAD_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    PLANNED_TO_BROKER_FIELD_NUMBER: _ClassVar[int]
    CV_BEFORE_FIELD_NUMBER: _ClassVar[int]
    CV_AFTER_ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    topic_name: str
    from_broker: str
    to_broker: str
    reason: str
    estimated_load: float
    timestamp: float
    planned_to_broker: str
    cv_before: float
    cv_after_estimated: float
    strategy: str
    outcome: str
    def __init__(self, topic_name: _Optional[str] = ..., from_broker: _Optional[str] = ..., to_broker: _Optional[str] = ..., reason: _Optional[str] = ..., estimated_load: _Optional[float] = ..., timestamp: _Optional[float] = ..., planned_to_broker: _Optional[str] = ..., cv_before: _Optional[float] = ..., cv_after_estimated: _Optional[float] = ..., strategy: _Optional[str] = ..., outcome: _Optional[str] = ...) -> None: ...

class RebalancingHistoryResponse(_message.Message):
    __slots__ = ("moves",)
    MOVES_FIELD_NUMBER: _ClassVar[int]
    moves: _containers.RepeatedCompositeFieldContainer[RebalancingMove]
    def __init__(self, moves: _Optional[_Iterable[_Union[RebalancingMove, _Mapping]]] = ...) -> None: ...

class RepartitionRequest(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: int
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[int] = ...) -> None: ...

class PartitioningResponse(_message.Message):
    __slots__ = ("name", "partitions", "partitioning_version", "generation", "marker_json", "drained", "retired", "global_adoption", "adoption_generation", "progress_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONING_VERSION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MARKER_JSON_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_ADOPTION_FIELD_NUMBER: _ClassVar[int]
    ADOPTION_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: int
    partitioning_version: int
    generation: int
    marker_json: str
    drained: bool
    retired: _containers.RepeatedScalarFieldContainer[int]
    global_adoption: int
    adoption_generation: int
    progress_json: str
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[int] = ..., partitioning_version: _Optional[int] = ..., generation: _Optional[int] = ..., marker_json: _Optional[str] = ..., drained: _Optional[bool] = ..., retired: _Optional[_Iterable[int]] = ..., global_adoption: _Optional[int] = ..., adoption_generation: _Optional[int] = ..., progress_json: _Optional[str] = ...) -> None: ...
