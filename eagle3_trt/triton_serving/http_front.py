"""The HTTP front of ``eagle3-trt serve``: the user's HTTP port, passing everything on to tritonserver.

Why it exists: tritonserver 2.51 answers a ``/generate`` body its JSON reader cannot convert with
HTTP 500 and no field named, before any model code runs (triton-inference-server/server
src/http_server.cc@v2.51.0: ``EVRequestToJson`` and ``ReadDataFromJson`` errors are
``TRITONSERVER_ERROR_INTERNAL``, which ``HttpCodeFromError`` answers as 500). So ``serve`` puts this
process on the user's port and moves tritonserver's HTTP endpoint to a loopback port of its own.
``/v2/models/<name>[/versions/<v>]/generate`` and ``/generate_stream`` bodies are checked against the
inputs that model's ``config.pbtxt`` declares (``generate_body.check_generate_body``); a bad one gets
HTTP 400 in Triton's error shape (``{"error": "<field>: ..."}``). Every other request, and every good
body, goes to tritonserver unchanged, and its answer comes back as it arrives (SSE chunks included).
A client that disconnects mid-stream closes the upstream connection, so Triton cancels the request
as it did without the front.

The process exits when tritonserver (``--watch-pid``) does, and on SIGTERM (``stop``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from pathlib import Path

from aiohttp import ClientConnectionError, ClientSession, ClientTimeout, TCPConnector, web
from yarl import URL

from eagle3_trt.errors import UserError
from eagle3_trt.procs import HOST, pid_alive
from eagle3_trt.triton_serving.generate_body import check_generate_body
from eagle3_trt.triton_serving.interface import TensorSpec
from eagle3_trt.triton_serving.pbtxt import declared_inputs
from eagle3_trt.triton_serving.request_params import RequestError

GENERATE_PATH = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/[^/]+)?/generate(?:_stream)?$")
# Hop-by-hop headers (RFC 9110 7.6.1) and those aiohttp sets itself for the body it sends.
_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length", "expect"}
WATCH_INTERVAL_S = 0.5


class DeclaredInputs:
    """The inputs each model of the repository declares, re-read when its config.pbtxt changes."""

    def __init__(self, repo: Path):
        self.repo = repo
        self._cache: dict[str, tuple[float, dict[str, TensorSpec] | None]] = {}

    def of(self, model: str) -> dict[str, TensorSpec] | None:
        """None: not a model of this repository (tritonserver answers for it)."""
        path = self.repo / model / "config.pbtxt"
        if model.startswith(".") or "/" in model:
            return None
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return None
        cached = self._cache.get(model)
        if cached is None or cached[0] != mtime:
            try:
                inputs: dict[str, TensorSpec] | None = declared_inputs(path)
            except (UserError, OSError):
                inputs = None  # a config Triton would not load either: it answers for the model
            cached = (mtime, inputs)
            self._cache[model] = cached
        return cached[1]


def error_response(status: int, message: str) -> web.Response:
    """Triton's own error shape (``EVBufferAddErrorJson``): ``{"error": "..."}``."""
    return web.Response(status=status, text=json.dumps({"error": message}), content_type="application/json")


def _upstream_headers(request: web.Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() not in _HOP}


async def handle(request: web.Request) -> web.StreamResponse:
    app = request.app
    body = await request.read()
    m = GENERATE_PATH.match(request.path)
    encoded = request.headers.get("Content-Encoding", "identity").lower() not in ("", "identity")
    if request.method == "POST" and m and not encoded:  # a compressed body is tritonserver's to refuse (400)
        inputs = app["inputs"].of(m.group("model"))
        if inputs is not None:
            try:
                check_generate_body(body, inputs)
            except RequestError as e:
                return error_response(400, str(e))
    session: ClientSession = app["session"]
    url = URL(app["upstream"] + request.raw_path, encoded=True)  # the path and query as the client sent them
    try:
        upstream = await session.request(request.method, url, headers=_upstream_headers(request), data=body or None, allow_redirects=False)
    except (ClientConnectionError, asyncio.TimeoutError):
        return error_response(503, "tritonserver is not reachable (starting, stopping or stopped); retry later")
    try:
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for k, v in upstream.headers.items():
            if k.lower() not in _HOP:
                resp.headers.add(k, v)
        if upstream.content_length is not None and "chunked" not in upstream.headers.get("Transfer-Encoding", "").lower():
            resp.content_length = upstream.content_length
        await resp.prepare(request)
        async for chunk in upstream.content.iter_any():  # as it arrives: SSE events are not held back
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        # On a client that went away (the handler is cancelled, or a write fails) this closes the
        # upstream connection instead of returning it to the pool: tritonserver cancels the request.
        upstream.close()


async def _watch(pid: int) -> None:
    while pid_alive(pid):
        await asyncio.sleep(WATCH_INTERVAL_S)
    raise web.GracefulExit()


def make_app(repo: Path, upstream_port: int) -> web.Application:
    # client_max_size: tritonserver's own limit for an HTTP body is far above aiohttp's 1 MiB default
    app = web.Application(client_max_size=1 << 30)
    app["inputs"] = DeclaredInputs(repo)
    app["upstream"] = f"http://{HOST}:{upstream_port}"

    async def session_ctx(app: web.Application):
        # No total timeout: a stream lasts as long as generation does. One connection per request, closed
        # when it ends (force_close): tritonserver 2.51's HTTP service waits for open connections on SIGTERM
        # ("Found 1 HTTP service connections"), so an idle pooled one held `stop` for its whole exit timeout.
        connector = TCPConnector(limit=0, force_close=True)
        app["session"] = ClientSession(connector=connector, timeout=ClientTimeout(total=None, sock_connect=10), auto_decompress=False)
        yield
        await app["session"].close()

    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def _serve(args: argparse.Namespace) -> None:
    runner = web.AppRunner(make_app(Path(args.repo), args.upstream_port), handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, HOST, args.port, shutdown_timeout=1.0).start()
    print(f"eagle3 HTTP front on http://{HOST}:{args.port} -> tritonserver http://{HOST}:{args.upstream_port}", flush=True)
    try:
        await _watch(args.watch_pid) if args.watch_pid else await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m eagle3_trt.triton_serving.http_front", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True, help="the user's HTTP port (on 127.0.0.1)")
    p.add_argument("--upstream-port", type=int, required=True, help="tritonserver's own HTTP port (on 127.0.0.1)")
    p.add_argument("--repo", required=True, help="the model repository tritonserver serves (its config.pbtxt files)")
    p.add_argument("--watch-pid", type=int, default=0, help="exit when this process (tritonserver) has exited")
    args = p.parse_args(argv)
    try:
        asyncio.run(_serve(args))
    except (web.GracefulExit, KeyboardInterrupt):
        pass


if __name__ == "__main__":
    main()
