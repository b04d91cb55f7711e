"""P-EAGLE's training objective, as speculators 0.9.0 trains it, in the layout ``train-draft`` uses.

speculators 0.9.0 ``models/peagle/core.py`` (``PEagleDraftModel.forward``), ``data.py``
(``generate_cod_sample_indices``), ``attention.py`` (``create_peagle_mask_mod``) and ``metrics.py``
(``compute_metrics``: KL(target || draft) per element, ``losses/eager.py`` ``kl_div_loss``):

- a parallel group starts at an anchor position a of the (shifted) training sequence; its depth-0
  element is the real one (token a+1, the target's aux states at a, position a); its depth-d elements
  (d = 1..K-1) are mask slots: ``mask_token_id`` through the draft's own (trained) ``embed_tokens``,
  ``mask_hidden`` through fc (as the aux states are), position a+d;
- element (a, d) is trained towards the target's distribution at a+d+1 (the token after its position);
- attention (``create_peagle_mask_mod``): an element sees every depth-0 element of an anchor <= its
  own, and the elements of its own group of depth <= its own.

That is exactly vLLM's inference pass (speculative/peagle/draft.py): the bonus token with the last
verified hidden state, then K-1 mask slots. speculators samples the groups (COD sampling: depth d keeps
a ``max(r**d, r_min)`` share of the anchors, a memory saving on long sequences); here every anchor
has its whole group (the dense case, r = 1), so each depth's loss is the mean over all anchors.

``parallel_unroll`` returns the logits per depth in ``trainer.ttt_unroll``'s layout (list over depth
k = 1..K of [B, S, D], index t = the element at position t, i.e. anchor t-k+1), so the trainer's loss,
its per-step accuracy and its held-out teacher-forced accuracy apply unchanged: step k at t is the
k-th draft of the group anchored at t-k+1, labelled with the target's distribution at t+1.
"""

from __future__ import annotations

from typing import Any

import torch

from eagle3_trt.errors import UserError
from eagle3_trt.speculative.peagle.draft import PEagleDraft
from eagle3_trt.speculative.peagle.export import speculators_config, speculators_tensors


def parallel_mask(seq_len: int, depths: int, device: torch.device | str | None = None) -> torch.Tensor:
    """bool [K*S, K*S], True = may attend; element index d*S + t is depth d at position t (anchor t-d).

    ``create_peagle_mask_mod`` on one document: (key depth 0 and key anchor <= query anchor) or (same
    anchor and key depth <= query depth)."""
    t = torch.arange(seq_len, device=device)
    d = torch.arange(depths, device=device)
    pos = t[None, :].expand(depths, -1).reshape(-1)  # position of element d*S + t
    dep = d[:, None].expand(-1, seq_len).reshape(-1)
    anchor = pos - dep
    q_anchor, k_anchor = anchor[:, None], anchor[None, :]
    q_dep, k_dep = dep[:, None], dep[None, :]
    return ((k_dep == 0) & (k_anchor <= q_anchor)) | ((k_anchor == q_anchor) & (k_dep <= q_dep))


def parallel_unroll(draft: PEagleDraft, next_ids: torch.Tensor, aux: torch.Tensor, depths: int) -> list[torch.Tensor]:
    """Draft logits [B, S, D] of depths 1..K over a window, in one forward.

    ``next_ids`` [B, S]: token t+1 at index t (the depth-0 element's input token, embedded with the
    draft's own ``embed_tokens``, trained as speculators trains it); ``aux`` [B, S, A*T]: the target's
    aux states at t. Depth k's logits at t are the group anchored at t-k+1 (invalid for t < k-1: the
    trainer masks them, as it masks a TTT chain that would start before position 0)."""
    B, S = next_ids.shape
    dev = next_ids.device
    real_e = draft.embed_tokens(next_ids)
    real_h = draft.fuse(aux)
    masks = depths - 1
    mask_e = draft.embed_tokens(torch.full((1, 1), draft.mask_token_id, dtype=torch.long, device=dev)).to(real_e.dtype)
    mask_h = draft.mask_state().to(real_h.dtype)
    embeds = torch.cat([real_e, mask_e.expand(B, masks * S, -1)], dim=1)
    hidden = torch.cat([real_h, mask_h.expand(B, masks * S, -1)], dim=1)
    positions = torch.arange(S, device=dev).repeat(depths)[None].expand(B, -1)
    attend = parallel_mask(S, depths, dev)[None].expand(B, -1, -1)
    _, logits, _ = draft(embeds, hidden, positions, past=None, mask=attend)
    assert logits is not None
    return list(logits.split(S, dim=1))


def init_from_eagle3(draft: torch.nn.Module, target_embed: torch.Tensor, mask_token_id: int, seed: int) -> PEagleDraft:
    """A P-EAGLE head started from an EAGLE-3 head's layers (``Eagle3Draft``), as speculators starts one:
    ``embed_tokens`` from the target's embedding (``load_verifier_weights``), ``mask_hidden`` random
    normal (``PEagleDraftModel.__init__``: ``torch.randn(1, 1, num_aux * hidden_size)``)."""
    out = PEagleDraft(draft.config, mask_token_id).float()
    missing, unexpected = out.load_state_dict(draft.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"embed_tokens.weight", "mask_hidden"}, (missing, unexpected)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if "embed_tokens.weight" in missing:  # an EAGLE-3 head of the target's width reads the target's table
            out.embed_tokens.weight.copy_(target_embed.float().cpu())
        out.mask_hidden.copy_(torch.randn(out.mask_hidden.shape, generator=g))
    return out


def resolve_mask_token_id(explicit: int | None, tokenizer: Any, vocab_size: int) -> int:
    """The mask token as speculators 0.9.0 picks it (``train/utils.py`` ``resolve_mask_token_id``):
    the explicit id; else the tokenizer's mask token; else the first id past the tokenizer when the
    embedding has unused slots (speculators adds ``<|MASK|>`` there); else pad, eos, unk."""
    if explicit is not None:
        if not 0 <= explicit < vocab_size:
            raise UserError("--mask-token-id", f"{explicit} is outside the target's vocabulary ({vocab_size} ids)", "pass a target token id")
        return int(explicit)
    if getattr(tokenizer, "mask_token_id", None) is not None:
        return int(tokenizer.mask_token_id)
    if len(tokenizer) < vocab_size:
        return len(tokenizer)
    for name in ("pad_token_id", "eos_token_id", "unk_token_id"):
        if getattr(tokenizer, name, None) is not None:
            return int(getattr(tokenizer, name))
    raise UserError("--mask-token-id", "the tokenizer has no mask, pad, eos or unk token and no unused embedding slot", "pass --mask-token-id")


class PEagleTraining:
    """The training hooks ``train-draft --method peagle`` calls (train/ stays method-agnostic)."""

    # train-draft --help's line for this method (train/commands.py builds --method's help from the registry)
    summary = "a P-EAGLE head (parallel drafting, speculators' objective), written in speculators' layout for vLLM"
    # its head drafts later tokens from mask slots: train-draft --mask-token-id applies (default as speculators picks it)
    mask_slots = True

    @staticmethod
    def unroll(draft: torch.nn.Module, next_ids: torch.Tensor, target_embed: torch.Tensor, aux: torch.Tensor, k: int) -> list[torch.Tensor]:
        assert isinstance(draft, PEagleDraft)
        return parallel_unroll(draft, next_ids, aux, k)  # its own embed_tokens, not the target's

    @staticmethod
    def check(mask_token_id: int | None, vocab_size: int) -> None:
        """The request's method options, refused before any work (the explicit mask token must be a target id)."""
        if mask_token_id is not None and not 0 <= mask_token_id < vocab_size:
            raise UserError("--mask-token-id", f"{mask_token_id} is outside the target's vocabulary ({vocab_size} ids)", "pass a target token id")

    @staticmethod
    def make_head(eagle3: torch.nn.Module, target_embed: torch.Tensor, seed: int, mask_token_id: int | None, tokenizer: Any) -> PEagleDraft:
        """The head to train, from the EAGLE-3 head train-draft starts (fresh or --init)."""
        mask_id = resolve_mask_token_id(mask_token_id, tokenizer, int(target_embed.shape[0]))
        return init_from_eagle3(eagle3, target_embed, mask_id, seed)

    @staticmethod
    def files(
        draft: torch.nn.Module, cfg: Any, d2t: torch.Tensor | None, t2d: torch.Tensor | None, token_ids: dict[str, Any], k: int, verifier: str
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(config.json, model.safetensors tensors) in speculators' P-EAGLE layout."""
        assert isinstance(draft, PEagleDraft)
        return speculators_config(cfg, token_ids, draft.mask_token_id, k, verifier), speculators_tensors(draft, d2t, t2d)


__all__ = ["PEagleTraining", "init_from_eagle3", "parallel_mask", "parallel_unroll", "resolve_mask_token_id"]
