"""Minimal Python relays under uvicorn (httptools, uvloop): the framework's floor.
mode canned: answer without a backend; relay: POST to the backend through kvgate's http1 Pool
and pass its chunks on; raw: an asyncio Protocol (httptools parser), relaying the same way."""
import asyncio, sys
import httptools, uvicorn
from kvgate.middleware.forward.http1 import Pool

mode, port, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3]
URL = backend + "/v1/chat/completions"
HDR = {"content-type": "application/json"}
CANNED = b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}'

pool = None

async def app(scope, receive, send):
    global pool
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"}); return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    if mode == "canned":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": CANNED})
        return
    if pool is None:
        pool = Pool(30.0)
    resp = await pool.post(URL, body, HDR, 60.0)
    stream = b'"stream": true' in body
    ctype = b"text/event-stream" if stream else b"application/json"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", ctype)]})
    async for chunk in resp.chunks():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


class Raw(asyncio.Protocol):
    def connection_made(self, t):
        self.t = t; self.p = httptools.HttpRequestParser(self); self.body = []
    def data_received(self, d):
        self.p.feed_data(d)
    def on_body(self, b):
        self.body.append(b)
    def on_message_complete(self):
        body = b"".join(self.body); self.body = []
        asyncio.get_running_loop().create_task(self.serve(body))
    async def serve(self, body):
        global pool
        if pool is None:
            pool = Pool(30.0)
        resp = await pool.post(URL, body, HDR, 60.0)
        stream = b'"stream": true' in body
        ctype = b"text/event-stream" if stream else b"application/json"
        self.t.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype + b"\r\ntransfer-encoding: chunked\r\n\r\n")
        async for chunk in resp.chunks():
            self.t.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.t.write(b"0\r\n\r\n")

if mode == "raw":
    import uvloop
    async def main():
        srv = await asyncio.get_running_loop().create_server(Raw, "127.0.0.1", port)
        await srv.serve_forever()
    uvloop.run(main())
else:
    np = mode.endswith("_np")
    if np: mode = mode[:-3]
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning", lifespan="on", access_log=False, proxy_headers=not np, server_header=not np, date_header=not np)
