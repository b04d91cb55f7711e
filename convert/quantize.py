"""Post-training quantization of the target (and optionally the draft) with NVIDIA ModelOpt.

Configs come from ModelOpt itself (FP8_DEFAULT_CFG, NVFP4_DEFAULT_CFG, FP8_KV_CFG); we only
add exclusions and merge the KV-cache config, in a way that works with both the list form
(ModelOpt >= 0.4x) and the older dict form (ModelOpt 0.37 in TensorRT-LLM containers).
lm_head and embeddings stay unquantized (ModelOpt's defaults exclude them; we say so again
so a future default change cannot quietly quantize them).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from eagle3_trt.errors import UserError

DEFAULT_CALIB_FILE = Path(__file__).resolve().parent / "data" / "calib_prompts.jsonl"
ALWAYS_EXCLUDED = ("*lm_head*", "*embed_tokens*")


def _mtq():
    import modelopt.torch.quantization as mtq

    from eagle3_trt.convert import nvfp4_cpu

    nvfp4_cpu.install()
    return mtq


def quant_cfg(fmt: str, kv_cache: str = "auto", exclude: Sequence[str] = ALWAYS_EXCLUDED) -> dict:
    mtq = _mtq()
    base = {"fp8": mtq.FP8_DEFAULT_CFG, "nvfp4": mtq.NVFP4_DEFAULT_CFG}.get(fmt)
    if base is None:
        raise UserError("--quant", f"no ModelOpt config for {fmt!r}", "choose fp8 or nvfp4")
    cfg = copy.deepcopy(base)
    if kv_cache == "fp8":
        kv = copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"])
        if hasattr(mtq, "update_quant_cfg_with_kv_cache_quant"):
            cfg = mtq.update_quant_cfg_with_kv_cache_quant(cfg, kv)
        else:
            _merge(cfg, kv)
    _merge(cfg, [{"quantizer_name": p, "enable": False} for p in exclude])
    return cfg


def _merge(cfg: dict, entries) -> None:
    """Append quantizer entries to cfg['quant_cfg'] whether it is the list or the dict form."""
    qc = cfg["quant_cfg"]
    if isinstance(qc, list):
        qc.extend(entries if isinstance(entries, list) else [{"quantizer_name": k, **({"cfg": v} if "enable" not in v else v)} for k, v in entries.items()])
    else:
        items = entries.items() if isinstance(entries, dict) else [(e["quantizer_name"], {k: v for k, v in e.items() if k != "quantizer_name"}) for e in entries]
        for k, v in items:
            qc[k] = v.get("cfg", v) if isinstance(v, dict) and "cfg" in v else v


def load_prompts(path: Path | None, limit: int) -> list[str]:
    """First-turn prompts from a JSONL file ({"turns": [...]} or {"text": ...}) or a .txt file (one per line)."""
    path = Path(path) if path else DEFAULT_CALIB_FILE
    if not path.is_file():
        raise UserError(path, "calibration file not found", "pass --calib FILE (JSONL with 'turns' or 'text', or plain text)")
    out: list[str] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{n}", f"not valid JSON ({e.msg})", "one JSON object per line") from None
            text = (rec.get("turns") or [None])[0] if isinstance(rec, dict) else None
            text = text or (rec.get("text") if isinstance(rec, dict) else None)
            if not isinstance(text, str):
                raise UserError(f"{path}:{n}", "no 'turns' list or 'text' string", 'use {"turns": ["prompt"]} or {"text": "..."}')
            out.append(text)
        else:
            out.append(line)
        if len(out) >= limit:
            break
    if not out:
        raise UserError(path, "no prompts in the calibration file", "add at least one prompt")
    return out


def calibration_batches(tokenizer, prompts: list[str], max_length: int) -> list[torch.Tensor]:
    """Token id tensors [1, n] of the prompts, chat-formatted when the tokenizer has a template."""
    batches = []
    for p in prompts:
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
                ids = ids["input_ids"]
        else:
            ids = tokenizer(p)["input_ids"]
        batches.append(torch.tensor([list(ids)[:max_length]], dtype=torch.long))
    return batches


def calibration_hash(batches: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for b in batches:
        h.update(b.numpy().tobytes())
    return h.hexdigest()


def quantize_target(model, batches: list[torch.Tensor], fmt: str, kv_cache: str, on_step: Callable[[], None] | None = None):
    """In-place PTQ of a HF causal LM; returns the model."""
    mtq = _mtq()
    device = next(model.parameters()).device

    def forward_loop(m):
        with torch.no_grad():
            for ids in batches:
                m(input_ids=ids.to(device), use_cache=False)
                if on_step:
                    on_step()

    return mtq.quantize(model, quant_cfg(fmt, kv_cache), forward_loop=forward_loop)


def aux_hidden_states(model, ids: torch.Tensor, layer_ids: Sequence[int]) -> torch.Tensor:
    """Concatenated outputs of the target's decoder layers layer_ids (TensorRT-LLM convention)."""
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    # hidden_states[0] is the embedding output, hidden_states[i + 1] the output of layer i.
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


def quantize_draft(draft, target_model, batches: list[torch.Tensor], layer_ids: Sequence[int], fmt: str,
                   on_step: Callable[[], None] | None = None):
    """PTQ of the EAGLE-3 head, calibrated on the target's own aux states (teacher-forced step 1)."""
    mtq = _mtq()
    embed = target_model.get_input_embeddings()
    device = next(target_model.parameters()).device
    inputs = []
    for ids in batches:
        ids = ids.to(device)
        if ids.shape[1] < 2:
            continue
        aux = aux_hidden_states(target_model, ids, layer_ids)
        with torch.no_grad():
            emb = embed(ids[:, 1:])
        pos = torch.arange(ids.shape[1] - 1, device=device)[None]
        inputs.append((emb, aux[:, :-1], pos))

    def forward_loop(m):
        with torch.no_grad():
            for emb, aux, pos in inputs:
                m(emb.to(m.fc.weight.dtype), None, pos, aux=aux.to(m.fc.weight.dtype))
                if on_step:
                    on_step()

    return mtq.quantize(draft, quant_cfg(fmt, "auto", exclude=("*lm_head*",)), forward_loop=forward_loop)
