"""Webhook receivers for bench-webhooks.sh, one asyncio process on one port: endpoints.py PORT

/fail-400/* answers 400 at once, /hang/* never answers, /endless/* sends a status line and
then a header byte a second for ever, /ok/* answers 204 and stamps each lease's arrival.
GET /_counts gives requests per path and those arrivals. Standard library only.
"""

import asyncio
import json
import sys
import time

counts = {}    # path -> requests received (headers and body)
arrivals = []  # [time.time(), lease name] per event on /ok


async def handle(reader, writer):
    def answer(status, body=b""):
        writer.write(b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body))

    try:
        while True:  # the server may reuse a connection for the next delivery
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin1").split("\r\n")
            path = head[0].split(" ")[1]
            length = next((int(h.split(":", 1)[1]) for h in head[1:]
                           if h.lower().startswith("content-length:")), 0)
            body = await reader.readexactly(length)
            if path == "/_counts":
                answer(b"200 OK", json.dumps({"counts": counts, "arrivals": arrivals}).encode())
                continue
            counts[path] = counts.get(path, 0) + 1
            if path.startswith("/fail-400"):
                answer(b"400 Bad Request", b"bad")
            elif path.startswith("/ok"):
                arrivals.append([time.time(), json.loads(body).get("payload", {}).get("name")])
                answer(b"204 No Content")
            elif path.startswith("/hang"):
                await reader.read()  # until the server times out and closes
                return
            elif path.startswith("/endless"):
                writer.write(b"HTTP/1.1 200 OK\r\n")
                while True:
                    writer.write(b"X")
                    await writer.drain()
                    await asyncio.sleep(1)
            else:
                answer(b"404 Not Found")
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def main(port):
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
