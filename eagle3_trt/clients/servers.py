"""Finding and checking the server a client command talks to: URLs (given, recorded by
`eagle3-trt serve` / `serve-dynamo`, or the defaults), loopback checks, the model, the chat template."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlsplit

from eagle3_trt.clients.chat import PromptFormatter
from eagle3_trt.clients.openai_client import normalize_openai_url
from eagle3_trt.dynamo_serving.launcher import DEFAULT_STATE_DIR as DYNAMO_STATE_DIR
from eagle3_trt.dynamo_serving.launcher import Deployment
from eagle3_trt.errors import UserError
from eagle3_trt.triton_serving.server import ServerHandle


def _recorded_server(state_dir: Path) -> dict | None:
    """The ports of the server `eagle3-trt serve` recorded, read through its one reader; None if none."""
    try:
        return asdict(ServerHandle.load(state_dir))
    except UserError:
        return None


def resolve_urls(url: str | None, http: bool, metrics_url: str | None, state_dir: Path) -> tuple[str, str | None]:
    """--url, else the server `eagle3-trt serve` recorded, else Triton's default ports on 127.0.0.1."""
    rec = _recorded_server(state_dir)
    if url is None:
        if rec:
            url = f"127.0.0.1:{rec['http_port'] if http else rec['grpc_port']}"
        else:
            url = "127.0.0.1:8000" if http else "127.0.0.1:8001"
    if metrics_url is None:
        host = url.split("://")[-1].rsplit(":", 1)[0]
        if rec and host in ("127.0.0.1", "localhost") and url.rsplit(":", 1)[-1] in (str(rec["http_port"]), str(rec["grpc_port"])):
            metrics_url = f"http://127.0.0.1:{rec['metrics_port']}/metrics"
        elif url.rsplit(":", 1)[-1] in ("8000", "8001"):
            metrics_url = f"http://{host}:8002/metrics"
    return url, metrics_url


def is_loopback(url: str) -> bool:
    host = urlsplit(url if "://" in url else "//" + url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


def dynamo_bundle(openai_url: str, state_dir: Path = DYNAMO_STATE_DIR) -> str | None:
    """The bundle `eagle3-trt serve-dynamo` serves at ``openai_url`` (from its state file), if it recorded one."""
    try:
        dep = Deployment.load(state_dir)
    except UserError:
        return None
    return dep.bundle if dep is not None and normalize_openai_url(dep.url) == normalize_openai_url(openai_url) else None


def check_model(client) -> None:
    """Fail early, with the reason, when the server or the model is not there."""
    try:
        client.model_config()
    except Exception as e:
        msg = str(e.message() if hasattr(e, "message") else e).splitlines()[0]
        dynamo = client.server_kind == "dynamo"
        raise UserError(
            "--openai-url" if dynamo else "--url",
            f"model '{client.model}' at {client.url} is not reachable: {msg}",
            f"is the server running (`eagle3-trt {'serve-dynamo BUNDLE' if dynamo else 'serve REPO'}`) and the model name right (--model)?",
        ) from None


def make_formatter(client, bundle: Path | None, raw: bool, system: str | None):
    """Chat template from --bundle, else from the bundle path the server reports (if it exists here)."""
    if raw:
        return PromptFormatter(None, raw=True)
    if bundle is None:
        try:
            served = client.bundle_path()
        except Exception:
            served = None
        if served and Path(served).is_dir():
            bundle = Path(served)
        else:
            raise UserError(
                "--bundle",
                "the chat template comes from the bundle's tokenizer, and the server's bundle"
                + (f" ({served}) is not on this machine" if served else " path is unknown"),
                "pass --bundle DIR (the engine bundle) or --no-chat-template to send raw text",
            )
    return PromptFormatter(bundle, system=system)
