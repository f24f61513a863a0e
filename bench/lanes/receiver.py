#!/usr/bin/env python3
"""A webhook receiver for bench/lanes.sh (Python 3 standard library only).

    receiver.py MODE OUT

MODE: `ok`: every POST is answered 200 at once (keep-alive); `hang`: connections are accepted
and read, and nothing is ever answered (a black hole: the sender waits out its own timeout);
`delay:SECONDS`: every POST is answered 200 after SECONDS.

Listens on 127.0.0.1 on a port of the kernel's choosing and prints `listening PORT` once it
accepts connections. Each complete request's arrival time (time.time(), the clock
`date +%s.%N` reads) and its Idempotency-Key are kept in memory; on SIGTERM or SIGINT they are
written to OUT as JSON ({"requests": n, "unique": distinct keys, "times": [...]}) and the
process exits, closing every connection it holds.
"""

import asyncio
import json
import signal
import sys
import time

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"


class Receiver(asyncio.Protocol):
    def __init__(self, state):
        self.state = state
        self.buf = bytearray()
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        self.state["conns"].add(transport)

    def connection_lost(self, exc):
        self.state["conns"].discard(self.transport)

    def data_received(self, data):
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).split(b"\r\n")
            length, key = 0, b""
            for line in head[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value.strip())
                elif name == b"idempotency-key":
                    key = value.strip()
            total = end + 4 + length
            if len(self.buf) < total:
                return
            del self.buf[:total]
            self.state["times"].append(time.time())
            self.state["keys"].add(key)
            mode = self.state["mode"]
            if mode == "ok":
                self.transport.write(OK)
            elif mode == "hang":
                pass
            else:
                asyncio.get_running_loop().call_later(self.state["delay"], self.answer_later)

    def answer_later(self):
        if not self.transport.is_closing():
            self.transport.write(OK)


async def main(mode, out):
    state = {"mode": mode, "times": [], "keys": set(), "conns": set(), "delay": 0.0}
    if mode.startswith("delay:"):
        state["mode"], state["delay"] = "delay", float(mode.split(":", 1)[1])
    elif mode not in ("ok", "hang"):
        sys.exit(f"receiver.py: unknown mode {mode!r}")
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Receiver(state), "127.0.0.1", 0, backlog=1024)
    print("listening", server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    for transport in list(state["conns"]):
        transport.abort()
    with open(out, "w") as f:
        json.dump({"requests": len(state["times"]), "unique": len(state["keys"]),
                   "times": state["times"]}, f)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
