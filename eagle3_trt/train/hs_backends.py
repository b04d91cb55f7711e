"""Hidden-state backends: one interface, three engines that teacher-force token windows through the target.

Every backend has ``hidden_size``, ``aux_layer_ids`` (TensorRT-LLM convention, ascending),
``producer`` and ``teacher_forced(ids [B, S]) -> (aux [B, S, A*T], last [B, S, T])`` with ``last``
after the final norm: what ``hidden_states.collect`` writes into the one cache format
(formats/hidden_states.py). The responses inside the windows come from the serving engine
(``--endpoint``, train/regenerate.py), never from a second copy of the target.

- ``reference``: the project's reference target (``convert.load.load_target``, CPU or one GPU,
  quantized exports dequantized as the runtime runs them). What CI runs.
- ``hf``: Hugging Face ``AutoModelForCausalLM.from_pretrained(..., device_map=...)`` with
  ``output_hidden_states``: ``device_map="auto"`` spreads a 70B target's layers over the GPUs of
  one node (accelerate's big-model dispatch); ``"cpu"`` runs it here. Hugging Face's
  ``hidden_states[0]`` is the embedding output and ``hidden_states[i + 1]`` layer i's output, the
  same residual stream TensorRT-LLM captures for ``layer_id`` i
  (``tensorrt_llm/_torch/speculative/eagle3.py``, ``Eagle3SpecMetadata.maybe_capture_hidden_states``
  stores ``hidden_states + residual``; NVIDIA/TensorRT-LLM commit
  f933a608045a46426792263617475b359d568043). ModelOpt's ``compute_hidden_states_hf.py`` reads the
  same indices (NVIDIA/Model-Optimizer a2fbac7b, examples/speculative_decoding/collect_hidden_states:
  "layer k output is at index k+1"). The last entry is transformers' post-norm
  ``last_hidden_state`` (``capture_outputs(tie_last_hidden_states=True)``, transformers 5), so a
  capture of the last layer (L-1) is refused: Hugging Face does not expose its pre-norm output there.
- ``trtllm``: TensorRT-LLM's own writer, ``SaveHiddenStatesDecodingConfig`` (``decoding_type:
  SaveState``; NVIDIA/TensorRT-LLM PR #7012 "Save state first pass", merged 2025-08; documented in
  the 1.3.0rc27 and 1.4.0rc4 LLM API references; writer ``tensorrt_llm/_torch/speculative/
  save_hidden_state.py``, commit 17c59c369a8f180e95386d7d434136b68b95bfbb). The kwargs are built
  through the project's adapter (``pipeline.trtllm_adapter.serving_llm_kwargs``: the bundle's
  target, as it is served); whether the installed release has the class decides, not a version
  number. Its files are read by ``hs_convert.read_trtllm_dump``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from eagle3_trt.convert.load import load_target
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import read_json
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.pipeline.trtllm_adapter import serving_llm_kwargs

BACKENDS = ("reference", "hf", "trtllm")
SAVE_STATE_PREFIX = "eagle3trt"


class HFBackend:
    """Hugging Face transformers with ``device_map`` (accelerate dispatches the layers)."""

    producer = "hf"

    def __init__(self, target_dir: Path, aux_layer_ids: tuple[int, ...], device_map: Any = "auto", dtype: torch.dtype = torch.bfloat16):
        from transformers import AutoModelForCausalLM  # local: only the hf backend loads transformers' model classes

        target_dir = Path(target_dir)
        cfg = read_json(target_dir / "config.json")
        if cfg.get("quantization_config") or (target_dir / "hf_quant_config.json").is_file():
            raise UserError(
                target_dir / "config.json",
                "is a quantized export; the hf backend loads BF16/FP16 checkpoints",
                "use --backend reference (dequantizes as the runtime serves it) or --backend trtllm, or point --target at the BF16 model",
            )
        n_layers = int(cfg.get("num_hidden_layers") or cfg.get("text_config", {}).get("num_hidden_layers", 0))
        if n_layers - 1 in aux_layer_ids:
            raise UserError(
                "--aux-layers",
                f"layer {n_layers - 1} is the target's last layer; Hugging Face returns it only after the final norm",
                "capture earlier layers (default 1, L//2-1, L-4), or use --backend reference",
            )
        self.aux_layer_ids = tuple(sorted(aux_layer_ids))
        self.model = AutoModelForCausalLM.from_pretrained(str(target_dir), device_map=device_map, dtype=dtype, trust_remote_code=False).eval()
        self.hidden_size = int(self.model.config.get_text_config().hidden_size)

    @torch.no_grad()
    def teacher_forced(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # the decoder alone: the lm_head over a 128k vocabulary is not needed (training
        # recomputes the target's logits from ``last``), and right padding needs no mask
        decoder = self.model.base_model
        first = self.model.get_input_embeddings().weight.device
        out = decoder(input_ids=input_ids.to(first), output_hidden_states=True, use_cache=False)
        hs = out.hidden_states
        aux = torch.cat([hs[i + 1].to("cpu") for i in self.aux_layer_ids], dim=-1)
        return aux, out.last_hidden_state.to("cpu")


def reference_backend(target_dir: Path, aux_layer_ids: tuple[int, ...], device: str = "cpu", dtype: torch.dtype = torch.float32):
    """The project's reference target (the backend train-draft has always used)."""
    return load_target(Path(target_dir), device=device, dtype=dtype, aux_layer_ids=aux_layer_ids)


def save_state_available() -> bool:
    """The installed TensorRT-LLM has the hidden-state writer (``SaveHiddenStatesDecodingConfig``)."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return False
    try:
        from tensorrt_llm.llmapi import SaveHiddenStatesDecodingConfig  # noqa: F401  # local: optional, GPU machines only
    except ImportError:
        return False
    return True


def trtllm_llm_kwargs(bundle_dir: Path, out_dir: Path, aux_layer_ids: tuple[int, ...], version: str | None = None) -> dict[str, Any]:
    """``LLM(**kwargs)`` that serves the bundle's target (no draft) and writes hidden states.

    ``write_interval=1``: one ``{file_prefix}_{n}.pt`` per request, n counting from 1 (the writer's
    ``_iter``); ``eagle3_layers_to_capture`` gets -1, the final post-norm state, which the writer
    then saves as ``hidden_state`` and as the last slot of ``aux_hidden_states``."""
    b = open_bundle(Path(bundle_dir))
    res = serving_llm_kwargs(Path(bundle_dir), b.options, speculation=False)
    kwargs = dict(res.kwargs)
    kwargs["speculative_config"] = {
        "decoding_type": "SaveState",
        "output_directory": str(Path(out_dir).resolve()),
        "write_interval": 1,
        "file_prefix": SAVE_STATE_PREFIX,
        "eagle3_layers_to_capture": [*sorted(aux_layer_ids), -1],
    }
    return kwargs


def check_trtllm_usable() -> None:
    """One line when this machine cannot run the trtllm backend."""
    if not save_state_available():
        raise UserError(
            "--backend",
            "trtllm needs a TensorRT-LLM release with SaveHiddenStatesDecodingConfig (PR #7012) installed",
            "install TensorRT-LLM on the GPU machine, or use --backend hf --device-map auto",
        )
    if not torch.cuda.is_available():
        raise UserError("--backend", "trtllm needs a GPU; torch sees none", "use --backend hf --device-map cpu or --backend reference here")
