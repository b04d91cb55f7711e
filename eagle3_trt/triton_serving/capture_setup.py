"""The Triton model's traffic capturer, set up from the environment ``eagle3-trt serve --capture`` gives the server.

``LlmServing`` (job.py) calls ``triton_capturer`` itself, so a repository packaged before capture
existed (its ``model.py`` copied then) captures all the same: everything a record needs is found
from the Python-backend stub process. The stub's command line is
``triton_python_backend_stub REPO/<model>/<version>/model.py <shm region> ...`` (seen with
tritonserver 2.51, nvidia-pytriton 0.7.0), which names the model and Triton's model version; the
``eagle3.yaml`` beside that ``model.py`` names the bundle, whose manifest fingerprint identifies
what was served.

Capture never stops a model from loading: anything wrong here is one warning and no capture.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.runtime.capture import Capturer, CaptureSource, config_from_env, load_tokenizer
from eagle3_trt.triton_serving.model_yaml import SERVING_YAML, load_serving_yaml, resolve_bundle


def stub_model_dir(cmdline: bytes | None = None) -> Path | None:
    """REPO/<model>/<version> of the Python-backend stub this process is, from its command line."""
    if cmdline is None:
        try:
            cmdline = Path("/proc/self/cmdline").read_bytes()
        except OSError:
            return None
    args = [a.decode("utf-8", "replace") for a in cmdline.split(b"\0") if a]
    for a in args[1:3]:
        if a.endswith("/model.py"):
            return Path(a).parent
    return None


def triton_capturer(warn: Callable[[str], None], model_dir: Path | None = None) -> Capturer | None:
    """The capturer for this model instance when the server runs with ``--capture``; else None."""
    try:
        cfg = config_from_env()
        if cfg is None:
            return None
        mdir = model_dir or stub_model_dir()
        if mdir is None:
            warn("capture off: cannot tell which model this process serves (not a Triton Python-backend stub)")
            return None
        sv_path = mdir / SERVING_YAML
        bundle = open_bundle(resolve_bundle(load_serving_yaml(sv_path), sv_path))
        source = CaptureSource(bundle.manifest.fingerprint, mdir.parent.name, "triton", mdir.name)
        tok_dir = bundle.tokenizer_dir
        return Capturer(cfg, source, tokenizer=lambda: load_tokenizer(tok_dir), warn=warn)
    except Exception as e:  # capture must not keep a model from serving
        warn(f"capture off: {type(e).__name__}: {e}")
        return None
