"""gRPC over HTTP/2 served on the broker's own event loop (the ``h2`` engine).

Modules: ``frames`` (HTTP/2 frames, byte by byte), ``headers`` (HPACK decoding of request
headers, with a memo), ``wire`` (gRPC's message framing and header values), ``call`` (one
call: its messages, handler task and status; also the handler's context), ``connection``
(one client connection: its life, and what calls use), with its mixins ``dispatch`` (frames
from the client, stream states, stream and connection errors), ``sending`` (DATA within flow
control, the send-queue bounds) and ``budget`` (receive windows; ``RequestBudget``, the
server-wide request budget), ``server``
(listening sockets, registration, graceful stop, server-wide limits), ``limits``
(``H2Limits``: every bound against hostile peers, with its default).
"""

from danube.server.h2grpc.limits import H2Limits, ServerLimits
from danube.server.h2grpc.server import H2Server

__all__ = ["H2Limits", "H2Server", "ServerLimits"]
