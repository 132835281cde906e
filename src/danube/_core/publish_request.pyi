from danube.proto.danube_batch.batch_pb2 import ProducerSpec

MAX_GROUP_DEPTH: int

class PublishRequest:
    sequence: int
    producer_id: int | None
    create: ProducerSpec | None
    frames: bytes | bytearray  # a CheckedFrames when checked at the read
    partitioning_version: int | None
    schema_id: int | None
    schema_version: int | None
    def __init__(
        self,
        sequence: int,
        producer_id: int | None,
        create: ProducerSpec | None,
        frames: bytes | bytearray,
        partitioning_version: int | None,
        schema_id: int | None,
        schema_version: int | None,
    ) -> None: ...

def parse(data: object) -> PublishRequest: ...
