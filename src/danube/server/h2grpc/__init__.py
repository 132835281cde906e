"""gRPC over HTTP/2 served on the broker's own event loop (the ``h2`` engine).

Modules: ``frames`` (HTTP/2 frames, byte by byte), ``headers`` (HPACK decoding of request
headers, with a memo), ``wire`` (gRPC's message framing and header values), ``call`` (one
call: its messages, handler task and status; also the handler's context), ``connection``
(one client connection: HTTP/2 streams, flow control, errors, writes), ``server``
(listening sockets, registration, graceful stop, server-wide limits), ``limits``
(``H2Limits``: every bound against hostile peers, with its default).
"""

from danube.server.h2grpc.limits import H2Limits, ServerLimits
from danube.server.h2grpc.server import H2Server

__all__ = ["H2Limits", "H2Server", "ServerLimits"]
