"""Plans for presets: a registry preset from its config-only files (build/model_configs/<preset>/), a
preset of the user's own from its checkpoints' config.json."""

from __future__ import annotations

from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.gpus import get_gpu
from eagle3_trt.pipeline.model_size import read_config
from eagle3_trt.pipeline.planner import KvDtype, Plan, make_plan
from eagle3_trt.pipeline.presets import Preset, load_preset, resolve_source
from eagle3_trt.resources import data_dir

MODEL_CONFIG_DIR = data_dir("build") / "model_configs"


def plan_for_preset(
    preset_name: str | Preset,
    gpu: str,
    gpus: int,
    quant: str | None,
    tp: int | None = None,
    *,
    target_cfg: dict[str, Any] | None = None,
    draft_cfg: dict[str, Any] | None = None,
    max_seq_len: int | None = None,
    max_batch_size: int | None = None,
    pp: int = 1,
) -> Plan:
    """Plan a registry preset from build/model_configs/<preset>/, a preset of the user's own
    (``plan --preset-file``) from its local or cached checkpoints' config.json, or explicit dicts."""
    own_file = isinstance(preset_name, Preset)
    preset = preset_name if isinstance(preset_name, Preset) else load_preset(preset_name)
    preset_name = preset.name
    spec = get_gpu(gpu)
    if target_cfg is None:
        target_cfg, draft_cfg = preset_configs(preset, own_file)
    # Per-generation default; a generation the preset does not name falls back to BF16.
    quant = quant or getattr(preset.quant, spec.generation, None) or "bf16"
    # "auto" keeps the checkpoint's KV format, unknown before quantization: plan the larger BF16.
    kv: KvDtype = "fp8" if preset.kv_cache_dtype == "fp8" else "bf16"
    return make_plan(
        target_cfg,
        draft_cfg,
        spec,
        gpus,
        quant,
        max_seq_len or preset.max_seq_len,
        kv,
        preset.max_draft_len,
        tp=tp,
        pp=pp,
        max_batch_size=max_batch_size,
        model=preset_name,
    )


def preset_configs(preset: Preset, own_file: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(target, draft) config.json of a preset: a preset of one's own from its checkpoints (local
    paths, or the HF cache), a registry preset from build/model_configs/<preset>/."""
    if own_file and not preset.target.embedded:
        tdir = resolve_source(preset.target, None, "target")
        ddir = resolve_source(preset.draft, None, "draft")
        assert tdir is not None and ddir is not None  # not embedded
        return read_config(tdir / "config.json"), read_config(ddir / "config.json")
    return _preset_configs(preset.name, bool(preset.target.embedded))


def _preset_configs(preset_name: str, embedded: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    root = MODEL_CONFIG_DIR / preset_name
    if not root.is_dir():
        if embedded:
            raise UserError(
                f"MODEL={preset_name}",
                "embedded presets have no config-only files; they are planned from their generated files",
                "generate the pair first and pass its config.json files as target_cfg/draft_cfg",
            )
        raise UserError(f"MODEL={preset_name}", f"no config-only files under {root}", f"add {root}/target/config.json and draft/config.json")
    return read_config(root / "target" / "config.json"), read_config(root / "draft" / "config.json")
