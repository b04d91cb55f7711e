"""What a benchmark's numbers were measured on: server, model parameters, bundle, versions."""

from __future__ import annotations

import importlib.metadata
import platform
from pathlib import Path

from eagle3_trt import __version__
from eagle3_trt.clients.llm_client import LLMClient
from eagle3_trt.clients.openai_client import OpenAIClient
from eagle3_trt.pipeline.bundle import open_bundle


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe_environment(client: LLMClient | OpenAIClient, bundle: str | None = None) -> dict:
    """What the numbers were measured on: server, model parameters, bundle fingerprint, versions.

    ``bundle``: the bundle directory if it is on this machine (default: the one the server reports)."""
    env: dict = {
        "client": {"eagle3_trt": __version__, "tritonclient": _dist_version("tritonclient"), "python": platform.python_version(), "host": platform.node()},
        "server_kind": client.server_kind,
    }
    try:
        env["server"] = client.server_metadata()
    except Exception as e:
        env["server"] = {"error": str(e).splitlines()[0]}
    try:
        params = client.model_config().get("parameters", {})
        env["model_parameters"] = {k: (v.get("string_value") or v.get("stringValue")) for k, v in params.items()}
    except Exception as e:
        env["model_parameters"] = {"error": str(e).splitlines()[0]}
    bundle = bundle or env.get("model_parameters", {}).get("eagle3_bundle")
    if bundle:
        try:
            b = open_bundle(Path(bundle))
            env["bundle"] = {
                "path": str(b.path),
                "fingerprint": b.manifest.fingerprint,
                "label": b.label,
                "formats": b.formats,
                "k": b.k,
                "max_concurrency": b.options.speculative_config.max_concurrency,
                "built_with": b.manifest.versions,
            }
        except Exception as e:
            env["bundle"] = {"path": str(bundle), "error": str(e).splitlines()[0]}
    return env
