"""gRPC over HTTP/2 served on the broker's own event loop (the ``h2`` engine).

Modules: ``wire`` (gRPC's message framing and header values), ``call`` (one call:
its messages, handler task and status; also the handler's context),
``connection`` (one client connection: HTTP/2 state, flow control, writes),
``server`` (listening sockets, registration, graceful stop).
"""

from danube.server.h2grpc.server import H2Server, ServerLimits

__all__ = ["H2Server", "ServerLimits"]
