"""The health checks of the README and the docs pages fail when the server is not ready (issue 21 C5): a bare ``curl -s``
exits 0 on an HTTP 404 or 503, so ``curl -s ... && echo ready`` printed "ready" for a server that
was not. Each check is run as written, against a local HTTP server that answers an error, then 200."""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eagle3_trt.testing.readme_blocks import doc_pages

ROOT = Path(__file__).resolve().parents[1]
# a shell line that probes a server and reports it ready
CHECK = re.compile(r"^\s*curl\b.*&&\s*echo ready\b.*$", re.M)
ADDRESS = re.compile(r"(https?://)?(127\.0\.0\.1|localhost):\d+")


def health_checks() -> list[str]:
    return [c for page in doc_pages(ROOT) for c in CHECK.findall(page.read_text(encoding="utf-8"))]


class _Server:
    def __init__(self) -> None:
        self.status = 200
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(server.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:  # keep the test output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]


@pytest.fixture()
def http_server() -> Iterator[_Server]:
    s = _Server()
    t = threading.Thread(target=s.httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield s
    finally:
        s.httpd.shutdown()
        s.httpd.server_close()


def _run(check: str, port: int) -> subprocess.CompletedProcess:
    cmd = ADDRESS.sub(lambda m: f"{m.group(1) or ''}127.0.0.1:{port}", check)
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)


def test_the_readme_has_health_checks():
    assert health_checks(), "no `curl ... && echo ready` line in README.md or docs/: update CHECK"


@pytest.mark.needs("curl")
@pytest.mark.parametrize("status", [404, 503])
def test_a_health_check_fails_on_an_http_error(http_server, status):
    http_server.status = status
    for check in health_checks():
        r = _run(check, http_server.port)
        assert r.returncode != 0 and "ready" not in r.stdout, (check, r.stdout)


@pytest.mark.needs("curl")
def test_a_health_check_passes_on_200(http_server):
    for check in health_checks():
        r = _run(check, http_server.port)
        assert r.returncode == 0 and r.stdout.strip() == "ready", (check, r.stdout, r.stderr)
