"""Pre-flight checks that a target and an EAGLE-3 draft belong together.

Each check either passes (recorded with a short detail for the report) or raises a
UserError naming the file/field, what is wrong, and a hint. Warnings are recorded, never
silently dropped. The traps caught here all show up later only as a low acceptance rate.
"""

from __future__ import annotations

from dataclasses import replace

from eagle3_trt.convert.draft_format import DraftCheckpoint, head_hooks
from eagle3_trt.convert.target import TargetInfo
from eagle3_trt.convert.validate_draft import check_aux_layers, check_dtypes, check_rope, check_shapes, check_vocab_map
from eagle3_trt.convert.validate_report import ValidationReport
from eagle3_trt.convert.validate_target import check_target_context, check_target_family, check_target_weights
from eagle3_trt.convert.validate_tokenizer import check_target_tokenizer, check_tokenizers

# the checks the pipeline runs on their own (config only: the dry run) are imported from here with the report
__all__ = ["ValidationReport", "check_target_family", "check_target_tokenizer", "validate_pair"]


def validate_pair(target: TargetInfo, draft: DraftCheckpoint, max_seq_len: int, quant: str | None = None) -> ValidationReport:
    """Every check, on an EAGLE-3 head or on a registered method's own head (registry.method_for_head): such a head is an
    EAGLE-3 draft core plus the method's tensors, so the EAGLE-3 checks run on its core (``eagle3_core``)
    and the method's hooks check the rest against the target (a ``method`` line in the report)."""
    rep = ValidationReport()
    hooks = head_hooks(draft)
    if hooks is not None:
        rep.ok("method", hooks.check_target(draft, target.vocab_size))
        draft = eagle3_core(draft, hooks.method_tensors, target.hidden_size)
    check_target_family(target, rep)
    check_target_weights(target, rep)
    check_target_tokenizer(target, rep)
    check_dtypes(target, draft, rep, quant)
    check_tokenizers(target, draft, rep)
    check_shapes(target, draft, rep)
    check_aux_layers(target, draft, rep)
    check_vocab_map(target, draft, rep)
    check_rope(target, draft, max_seq_len, rep)
    check_target_context(target, max_seq_len, rep)
    return rep


def eagle3_core(draft: DraftCheckpoint, method_tensors: tuple[str, ...], target_hidden: int) -> DraftCheckpoint:
    """A method head's EAGLE-3 draft core: without the method's own tensors (its loader checked their
    shapes), so the EAGLE-3 checks neither miss nor warn about them. An own embedding stays where the
    EAGLE-3 core itself needs one (hidden size other than the target's)."""
    keep_embed = draft.config.hidden_size != target_hidden
    tensors = {k: v for k, v in draft.tensors.items() if k not in method_tensors or (keep_embed and k == "embed_tokens.weight")}
    return replace(draft, tensors=tensors)
