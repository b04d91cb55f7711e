"""What each EAGLE-3 head producer trained, and what TensorRT-LLM serves of it.

Read in each producer's source; the toolkit serves a head exactly where TensorRT-LLM computes the
function its producer trained, and refuses it in one line (naming the field and the producer) where it
cannot. Sources: SafeAILab EAGLE (``eagle/model/cnets.py``), ModelOpt 0.47
(``modelopt/torch/speculative/plugins/hf_eagle.py``), speculators 0.9.0 (``models/eagle3/core.py``,
``models/eagle3/model_definitions.py``, ``models/eagle3/config.py``, ``train/config/schema.py``,
``train/cli.py``, ``models/utils.py``), SpecForge 0.2.0 (``modeling/draft/llama3_eagle.py``,
``algorithms/eagle3/model.py``; repository snapshot a6b6b0230009d15ec2a97a57384e6f53f0f96946),
TensorRT-LLM (``_torch/models/modeling_speculative.py`` @ 00679c66c3e38f6d2651ad0a5bef0f94d862e36c,
``_torch/speculative/eagle3.py`` @ f933a608045a46426792263617475b359d568043), vLLM
(``v1/worker/gpu_model_runner.py`` ``load_model``, ``model_executor/models/llama_eagle3.py``).

fc's input blocks
  Every producer concatenates the aux states in ascending layer order, whatever order the config lists
  the ids in: SafeAILab (low, mid, high), ModelOpt (forward hooks on the listed layers, appended as the
  layers run), speculators (hidden states dumped by vLLM, which tests ``idx in aux_hidden_state_layers``
  during the forward), SpecForge (captured through SGLang, the same test). TensorRT-LLM sorts
  ``layers_to_capture`` (``Eagle3SpecMetadata.__post_init__``). So the blocks are never permuted: an
  unsorted list is the same set of layers.

``eagle_aux_hidden_state_layer_ids`` missing or null
  vLLM then takes the target's default ``(2, L//2, L-3)`` (``get_eagle3_default_aux_hidden_state_layers``),
  TensorRT-LLM its default ``{1, L//2-1, L-4}``: the same layers (vLLM's id i is TensorRT-LLM's i-1), and
  the layers speculators trains on when none are given (``resolve_target_layer_ids``). speculators'
  converter writes null unless told the ids. Served on the default layers, with a warning naming the field.

Norm flags
  ==========================  ==============================================  ==========================
  flag (producer)             trained function                                TensorRT-LLM
  ==========================  ==============================================  ==========================
  norm_before_fc (spec.)      input_norm = RMSNorm(A*T) over cat(aux)         eagle_config.norm_before_fc
  fc_norm (spec., SpecForge)  RMSNorm(T) per aux chunk before fc              top-level fc_norm
  norm_output (speculators)   feed norm(h) back; logits lm_head(norm(h))      return_hidden_post_norm
  norm_output (SpecForge)     logits lm_head(norm(h)) if true, lm_head(h)     true: the standard head;
                              if false; feedback is the pre-norm h            false: refused
  norm_before_residual (sp.)  residual = hidden_norm(h)                       refused (residual = h)
  ==========================  ==============================================  ==========================
  speculators' training defaults are norm_before_residual, norm_before_fc and norm_output all true
  (``train/config/schema.py``), so a head trained with its defaults is refused for norm_before_residual.
  A flat (SafeAILab/SpecForge) config's top-level ``norm_output`` is SpecForge's field; TensorRT-LLM would
  read it as post-norm feedback, so the bundle's draft config never carries it (post-norm feedback is
  written as ``eagle_config.return_hidden_post_norm``).

  ModelOpt (0.47 HF plugin, ``modeling_eagle.py``): the first layer is a transformers decoder layer whose
  own ``input_layernorm`` runs on the hidden branch before the EAGLE-3 pre-hook applies ``hidden_norm``,
  so it trains hidden_norm(input_layernorm(h)) where TensorRT-LLM computes hidden_norm(h) (the same only
  while input_layernorm's weight is ones). Its Megatron trainer's exports carry the same names and config,
  so the layout cannot tell the two apart: validate warns for a ModelOpt-layout head with a trained
  input_layernorm rather than refusing it.

Attention
  speculators builds the draft layer from ``transformer_layer_config.model_type``: "qwen3" layers apply
  q_norm/k_norm per head before rope; TensorRT-LLM's ``Eagle3Attention`` has none: refused (as is any head
  shipping q_norm/k_norm tensors). speculators trains its layers with a sliding window (default 2048) on
  the layers ``layer_types`` marks "sliding_attention"; TensorRT-LLM's Eagle3 draft attends the whole
  context. Within ``max_seq_len <= sliding_window`` every query-key distance is below the window, so the
  two functions are the same and the head is served; a longer ``max_seq_len`` is refused.

Extra layers
  TensorRT-LLM's ``Eagle3DraftModel`` holds ``num_hidden_layers`` layers (``midlayer.{i}``): layer 0 reads
  cat(input_layernorm(embeds), hidden_norm(h)); layers i >= 1 are "regular" (``next_layer_regular``,
  default true): residual h, ``hidden_norm(h)`` into H-wide q/k/v, then the MLP, each over the previous
  layer's full output (the residual it returns is added back before the next layer). speculators' later
  layers are plain decoder layers with ``input_layernorm`` in that place: the same function, so their
  ``layers.{i}.input_layernorm`` is served as TensorRT-LLM's ``midlayer.{i}.hidden_norm``.

Other methods
  speculators' ``speculators_model_type`` peagle is P-EAGLE, read by its own home
  (``eagle3_trt/speculative/peagle``) and served by vLLM; the EAGLE-3 path (a TensorRT-LLM bundle) refuses
  it, naming why. dflash, dflash2, dspark, xpress, mtp and SpecForge's P-EAGLE/DFlash/DSpark/Domino
  architectures are other drafting methods: refused in one line naming it (DFlash and DSpark are block
  drafters: one forward over a block of mask positions conditioned on target hidden states, with their own
  layer layout; MTP reuses the target's own next-token layers): ``validate``, ``engine`` and
  ``train-draft --init`` all read heads through ``convert.draft_format.load_draft``, which asks the method
  registry first (speculative/registry.py ``method_for_head``) and refuses the rest here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3_trt.errors import UserError

# speculators_model_type -> the method's name (speculators 0.9.0 models/*/config.py)
SPECULATORS_METHODS = {
    "peagle": "P-EAGLE",
    "dflash": "DFlash",
    "dflash2": "DFlash2",
    "dspark": "DSpark",
    "xpress": "XPress",
    "mtp": "MTP",
}
# SpecForge 0.2.0 draft architectures other than EAGLE-3 (modeling/draft/*.py, @register_draft)
SPECFORGE_METHODS = {
    "PEagleDraftModel": "P-EAGLE",
    "DFlashDraftModel": "DFlash",
    "DSparkDraftModel": "DSpark",
    "DominoDraftModel": "Domino",
}
# what the toolkit reads: EAGLE-3 heads and the methods registered with their own head format (P-EAGLE); a
# block drafter such as DFlash needs its own home (docs/architecture.md "Adding a speculation method")
LATER_ISSUE = (
    "eagle3-trt reads EAGLE-3 and P-EAGLE heads; another method needs its own home in eagle3_trt/speculative/ "
    "and one registry line (docs/architecture.md: Adding a speculation method)"
)


# P-EAGLE heads are read by their own home (eagle3_trt/speculative/peagle: vLLM's parallel drafting); on
# the EAGLE-3 path (a TensorRT-LLM bundle) they are refused: no TensorRT-LLM release has a P-EAGLE drafter
# (_torch/speculative/ @ 051edebb761177165b477835167762b73cdd3114: its PARD worker, pard.py, drafts from
# the draft's own embeddings and mask tokens without target hidden states, so it cannot run a P-EAGLE head)
PEAGLE_ON_EAGLE3_PATH = (
    "a P-EAGLE head (speculators): no TensorRT-LLM release serves P-EAGLE (its PARD worker reads no target hidden states); "
    "vLLM serves it with parallel_drafting"
)
PEAGLE_HINT = "measure it with the P-EAGLE method (eagle3_trt/speculative/peagle) and serve it with vLLM"


def refuse_other_method(raw: dict[str, Any], cfg_path: Path) -> None:
    """A head of another drafting method, named by the field that says so (P-EAGLE: its own path)."""
    kind = raw.get("speculators_model_type")
    if kind == "peagle":
        raise UserError(f"{cfg_path}:speculators_model_type", f"'peagle': {PEAGLE_ON_EAGLE3_PATH}", PEAGLE_HINT)
    if kind is not None and kind != "eagle3":
        method = SPECULATORS_METHODS.get(str(kind), str(kind))
        raise UserError(f"{cfg_path}:speculators_model_type", f"{kind!r}: a {method} head (speculators), not EAGLE-3", LATER_ISSUE)
    for arch in raw.get("architectures") or []:
        if arch in SPECFORGE_METHODS:
            raise UserError(f"{cfg_path}:architectures", f"{arch}: a {SPECFORGE_METHODS[arch]} head (SpecForge), not EAGLE-3", LATER_ISSUE)
    if "dflash_config" in raw:
        raise UserError(f"{cfg_path}:dflash_config", "a DFlash head (ModelOpt), not EAGLE-3", LATER_ISSUE)


def speculators_refusals(raw: dict[str, Any], layer_cfg: dict[str, Any], cfg_path: Path) -> None:
    """What a speculators eagle3 head trained that TensorRT-LLM's Eagle3 draft cannot compute."""
    if raw.get("norm_before_residual"):
        raise UserError(
            f"{cfg_path}:norm_before_residual",
            "true (speculators' training default): the head was trained with residual = hidden_norm(hidden), "
            "but TensorRT-LLM's Eagle3DecoderLayer adds the un-normed hidden state",
            "retrain with speculators' --no-norm-before-residual (TensorRT-LLM serves that function)",
        )
    model_type = layer_cfg.get("model_type")
    if model_type not in (None, "llama"):
        raise UserError(
            f"{cfg_path}:transformer_layer_config.model_type",
            f"{model_type!r}: speculators builds {model_type} draft layers (q_norm/k_norm per head for qwen3), "
            "which TensorRT-LLM's Eagle3Attention does not apply",
            "retrain with speculators' --draft-arch llama",
        )


def specforge_norm_output(raw: dict[str, Any], cfg_path: Path) -> None:
    """SpecForge's top-level ``norm_output`` (default true): the final norm before lm_head. TensorRT-LLM
    always applies it, so true is the standard head; false cannot be served."""
    v = raw.get("norm_output")
    if v is None or v is True:
        return
    if v is False:
        raise UserError(
            f"{cfg_path}:norm_output",
            "false (SpecForge: lm_head reads the un-normed hidden state), but TensorRT-LLM always applies the final norm before lm_head",
            "retrain with norm_output true (SpecForge's default)",
        )
    raise UserError(f"{cfg_path}:norm_output", f"{v!r} is not true/false", "write a JSON boolean")


def sliding_window(layer_cfg: dict[str, Any]) -> int | None:
    """The window speculators trains the draft's layers with: set when any layer's ``layer_types`` entry
    is "sliding_attention" (``Eagle3DraftModel.__init__``: sliding_window_indices), else None."""
    types = layer_cfg.get("layer_types") or []
    window = layer_cfg.get("sliding_window")
    if "sliding_attention" not in types or window is None:
        return None
    return int(window)


def window_refusal(window: int | None, max_seq_len: int, cfg_path: Path) -> UserError | None:
    """The refusal for a windowed head in a bundle whose contexts outgrow the window (None: served exactly)."""
    if window is None or max_seq_len <= window:
        return None
    return UserError(
        f"{cfg_path}:transformer_layer_config.sliding_window",
        f"{window}: speculators trained the draft's attention over the last {window} tokens, but TensorRT-LLM's Eagle3 "
        f"draft attends the whole context, a different function past {window} tokens (max_seq_len {max_seq_len})",
        f"build with --max-seq-len {window} or less, or retrain with full attention (--full-attention-indices 0)",
    )
