"""`danube admin serve`: Danube's admin gateway (HTTP/JSON for Danube's Admin UI, a built-in web
console, and an MCP server over stdio), an upper layer over the broker's admin gRPC API.

``config`` reads the options, ``backend`` speaks admin gRPC, ``metrics`` scrapes the brokers (and
keeps the embedded history) or asks Prometheus, ``pages`` and ``actions`` build Danube's JSON,
``http`` is the bounded HTTP/1.1 server, ``app`` routes, ``mcp_tools`` is the MCP mode.
See docs/gateway.md.
"""
