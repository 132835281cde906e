"""The client's own HTTP/2 transport for its hot streams (the batch lane's Publish and Consume).

Layers: ``frames`` (the codec and the frames a client builds), ``connection`` (one HTTP/2
connection as an asyncio protocol), ``call`` (a stream-stream call shaped like grpc.aio's),
``channel`` (a target's connection, reopened as needed), ``lane`` (the batch-lane stub using it),
``reading`` (one way for the streams to read either transport's calls a batch at a time).
"""
