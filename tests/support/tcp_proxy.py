"""A tiny TCP proxy for tests: ``python tcp_proxy.py TARGET_HOST TARGET_PORT``.

Listens on a free loopback port, prints it as the first line of stdout, and relays every connection
to the target.  Tests put it between one broker and etcd and freeze it with SIGSTOP (by its PID) to
cut that broker off from etcd while every other broker still reaches it.
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def main(host: str, port: int) -> None:
    async def handle(reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
