"""The P-EAGLE draft: the EAGLE-3 draft of core/draft.py plus the two things P-EAGLE trains, and the
parallel pass that drafts K tokens from one forward.

The model (speculators 0.9.0 ``models/peagle/core.py``, ``PEagleDraftModel(Eagle3DraftModel)``) is
the EAGLE-3 head, layer for layer (fc over the aux states, first layer over cat(embeds, hidden),
norm, lm_head, d2t), so the layers are ``Eagle3Draft``'s — one model core. P-EAGLE adds:

- ``mask_hidden`` [1, 1, A*T]: the aux states of every mask slot; it goes through the same fc (and
  fc_norm / input_norm) as the target's aux states: speculators' forward projects the sampled hidden
  states, mask slots included, through ``fc``; vLLM copies ``combine_hidden_states(mask_hidden)``
  into ``parallel_drafting_hidden_state_tensor`` at load (``llm_base_proposer.py`` ``load_model``).
- its own ``embed_tokens``, always: speculators trains it (``embed_requires_grad`` true) and vLLM keeps a
  draft's own embedding when it differs from the target's (``_maybe_share_embeddings``).

Parallel drafting, as vLLM's proposer runs it (``vllm/v1/spec_decode/llm_base_proposer.py`` @
00c4f22dae4795e34658bead82fa071e6bb7ae39 ``set_inputs_first_pass`` / ``propose``, and
``vllm/v1/spec_decode/utils.py`` @ 01046b9a33846d0561525a552c3c540ef9f56db0
``copy_and_expand_eagle_inputs_kernel``): per request the draft's one forward holds the verified
tokens shifted by one (token p+1 with the target's hidden state at p, position p), then the bonus
token with the hidden state of the last verified position, then K-1 slots of ``mask_token_id`` with
``parallel_drafting_hidden_state_tensor`` at the next K-1 positions; attention is causal over the
draft KV cache and these slots; the K draft tokens are the argmax of the logits at the bonus slot and
the K-1 mask slots (``token_indices_to_sample``), mapped through d2t; no second forward runs
(``if self.num_speculative_tokens == 1 or self.parallel_drafting: ... return``).

Computed here as the commit of the verified slots (core/drafting.py ``Drafter``: the same draft
inputs EAGLE-3 commits) followed by ``parallel_logits`` over the K-1 mask slots on that KV cache. The
split is exact: under a causal mask the verified slots never see the mask slots, and the mask slots see
exactly the committed cache plus the mask slots before them. The mask slots' KV is dropped after the
step; vLLM writes it by position and the next step's verified slots overwrite those positions before
any query reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from eagle3_trt.core.draft import KV, DraftWeights, Eagle3Draft


class PEagleDraft(Eagle3Draft):
    """``Eagle3Draft`` with P-EAGLE's ``mask_hidden`` and its own trained ``embed_tokens``."""

    mask_hidden: nn.Parameter

    def __init__(self, c: Any, mask_token_id: int) -> None:
        super().__init__(c)
        self.mask_token_id = int(mask_token_id)
        if not hasattr(self, "embed_tokens"):  # Eagle3Draft has one only when the hidden sizes differ
            self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.mask_hidden = nn.Parameter(torch.zeros(1, 1, self.fc.in_features))

    @classmethod
    def from_peagle_checkpoint(
        cls, ckpt: DraftWeights, mask_token_id: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> PEagleDraft:
        """Build from a normalized P-EAGLE checkpoint (TensorRT-LLM layer names, ``mask_hidden``, ``embed_tokens.weight``)."""
        m = cls(ckpt.config, mask_token_id)
        sd = {k: v for k, v in ckpt.tensors.items() if k in set(m.state_dict())}
        if "d2t" not in sd or ckpt.config.draft_vocab_size == ckpt.config.vocab_size:
            sd["d2t"] = torch.zeros(ckpt.config.draft_vocab_size, dtype=torch.int64)
        sd["d2t"] = sd["d2t"].to(torch.int64)
        m.load_state_dict(sd, strict=True)
        return m.to(device=device, dtype=dtype).eval()

    def mask_state(self) -> torch.Tensor:
        """The hidden state of a mask slot [1, 1, H]: ``mask_hidden`` through fc, as the aux states are."""
        return self.fuse(self.mask_hidden)


def parallel_logits(
    draft: PEagleDraft, embed: Callable[[torch.Tensor], torch.Tensor], past: KV, past_valid: torch.Tensor, root_pos: torch.Tensor, n_masks: int
) -> torch.Tensor:
    """Draft logits [B, n_masks, D] of the mask slots at positions root_pos+1 .. root_pos+n_masks.

    ``past``: the committed draft KV (the verified slots, bonus slot last); ``past_valid`` [B, P]: its
    valid entries; ``root_pos`` [B]: the bonus slot's position; ``embed``: token ids -> the draft's
    embeddings. The bonus slot's own logits (draft token 1) come from the commit pass.
    """
    B, dev = past_valid.shape[0], past_valid.device
    ids = torch.full((B, n_masks), draft.mask_token_id, dtype=torch.long)
    hidden = draft.mask_state().expand(B, n_masks, -1)
    pos = root_pos.to(dev)[:, None] + 1 + torch.arange(n_masks, device=dev)[None]
    causal = torch.ones(n_masks, n_masks, dtype=torch.bool, device=dev).tril()
    mask = torch.cat([past_valid[:, None, :].expand(B, n_masks, -1), causal[None].expand(B, -1, -1)], dim=-1)
    logits: torch.Tensor | None
    _, logits, _ = draft(embed(ids), hidden, pos, past=past, mask=mask)  # through __call__: the head's hooks (fake quant) run
    assert logits is not None
    return logits


def mask_feed(draft: PEagleDraft) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Inputs of every draft slot after the first, for a teacher-forced pass over many origins at once
    (measure/estimator.py): the mask token and the mask slot's hidden state, whatever the slot before
    predicted (the draft's one forward sees no draft token: vLLM's ``copy_and_expand_eagle_inputs_kernel``)."""

    def feed(prev_logits: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, Q = prev_logits.shape[:2]
        ids = torch.full((B, Q), draft.mask_token_id, dtype=torch.long, device=prev_logits.device)
        return ids, draft.mask_state().to(hidden.dtype).expand(B, Q, -1)

    return feed
