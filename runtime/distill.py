"""Quick distillation of an EAGLE-3 draft onto a (tiny) target's own greedy outputs.

The embedded tiny pair has random weights, so its draft accepts nothing and every acceptance
figure is 0. A few hundred steps of EAGLE-3-style training (step 1 from the target's fused aux
states, steps 2..K from the draft's own hidden state, "training-time test") on the target's
greedy continuations give a draft that really predicts the target: tests, benchmarks and demos
use it to exercise accepted tokens, per-position acceptance and the alpha tooling with non-zero
figures. Not a training recipe for real models (see train/ for that).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle3_trt.runtime.alpha import teacher_forced_drafts


def sharpen_target(target, factor: float = 20.0) -> None:
    """Scale every layer's o_proj and down_proj of a random (tiny) target in place.

    At initialization scale (std 0.02) each layer adds almost nothing to the residual stream,
    so every layer's output is about the input embedding and the greedy next token is a
    function of the current token only: a draft then learns a bigram table and ignores the
    target's hidden states, and wrong aux layers cannot hurt it. With larger residual updates
    the layers carry context, the draft has to use them, and capturing the wrong layers shows.
    """
    with torch.no_grad():
        for layer in target.hf.model.layers:
            layer.self_attn.o_proj.weight.mul_(factor)
            layer.mlp.down_proj.weight.mul_(factor)


def remap_draft_vocab(draft, sequences: list[list[int]], vocab_size: int, keep: list[int] = ()) -> None:
    """Point the draft vocabulary (d2t) at the target tokens the sequences use most (as EAGLE-3 does)."""
    D = draft.config.draft_vocab_size
    counts = torch.bincount(torch.tensor([t for s in sequences for t in s] or [0]), minlength=vocab_size).float()
    counts[list(keep)] += 1e9
    ids = torch.sort(torch.topk(counts, D).indices).values
    draft.d2t.copy_((ids - torch.arange(D)).to(draft.d2t.device))


def distill_draft(engine, prompts: list[list[int]], *, steps: int = 300, gen_tokens: int = 48, unroll: int = 3,
                  lr: float = 3e-3, batch: int = 16, seed: int = 0, remap_vocab: bool = True,
                  embed_dropout: float = 0.0, hidden_only: bool = False) -> list[float]:
    """Train ``engine.draft`` in place on ``engine.target``'s greedy continuations of ``prompts``.

    ``embed_dropout`` zeroes the token-embedding input of whole positions during training, which
    pushes the draft to rely on the target's hidden states; ``hidden_only`` removes the token
    input altogether (input_layernorm weight fixed at 0), so the draft predicts from the target's
    aux states and its own hidden state only, as a real draft largely does on a real target.
    Returns the loss history.
    """
    from eagle3_trt.core.engine import SamplingParams

    draft, target, dev = engine.draft, engine.target, engine.device
    res = engine.generate(prompts, SamplingParams(max_tokens=gen_tokens), speculate=False)
    seqs = [p + r.token_ids for p, r in zip(prompts, res)]
    if remap_vocab:
        remap_draft_vocab(draft, [r.token_ids for r in res], target.vocab_size, keep=list(engine.eos_token_ids))
        engine._d2t_ids = (torch.arange(draft.config.draft_vocab_size, device=dev) + draft.d2t.to(dev)).long()
    t2d = torch.full((target.vocab_size,), -100, dtype=torch.long, device=dev)
    t2d[engine._d2t_ids] = torch.arange(draft.config.draft_vocab_size, device=dev)

    N = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), N), engine.pad_token_id, dtype=torch.long)
    lens = torch.tensor([len(s) for s in seqs])
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
    valid = torch.arange(N)[None] < lens[:, None]
    allowed = (torch.tril(torch.ones(N, N, dtype=torch.bool))[None] & valid[:, None, :]) | torch.eye(N, dtype=torch.bool)[None]
    with torch.no_grad():
        _, aux = target.forward(ids, torch.arange(N)[None].expand(len(seqs), N), allowed, None,
                                logits_at=torch.zeros(len(seqs), 1, dtype=torch.long))
    ids = ids.to(dev)
    # labels[s][b, p] = draft id of token p+s+1 (ignored past the end / outside the draft vocab)
    labels = []
    for s in range(1, unroll + 1):
        lab = torch.full((len(seqs), N - 1), -100, dtype=torch.long, device=dev)
        lab[:, : N - 1 - s] = t2d[ids[:, s + 1:]]
        lab[(torch.arange(N - 1, device=dev)[None] + s + 1) >= lens.to(dev)[:, None]] = -100
        labels.append(lab)

    g = torch.Generator().manual_seed(seed)
    was_training = draft.training
    draft.train()
    if hidden_only:
        with torch.no_grad():
            draft.midlayer.input_layernorm.weight.zero_()
    params = [p for n, p in draft.named_parameters() if not (hidden_only and n == "midlayer.input_layernorm.weight")]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    def embed(t):  # the embedding is the target's, frozen
        e = engine._draft_embed(t).detach()
        if embed_dropout > 0:
            keep = (torch.rand(e.shape[:-1], generator=g) >= embed_dropout).to(e.device, e.dtype)
            e = e * keep[..., None]
        return e
    hist = []
    for step in range(steps):
        idx = torch.randperm(len(seqs), generator=g)[:batch]
        outs = teacher_forced_drafts(draft, embed, aux[idx], ids[idx], unroll, feed="truth", d2t_ids=engine._d2t_ids)
        loss = sum(F.cross_entropy(o.float().flatten(0, 1), lab[idx].flatten(), ignore_index=-100) * (0.8 ** s)
                   for s, (o, lab) in enumerate(zip(outs, labels)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        hist.append(float(loss.detach()))
    for p in params:
        p.requires_grad_(False)
    draft.train(was_training)
    draft.eval()
    return hist


def save_draft(draft, src_dir: Path, out_dir: Path) -> Path:
    """Write the (distilled) draft as a SafeAILab-layout directory next to its source config."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in draft.state_dict().items() if k not in ("d2t", "rope_freqs")}
    d2t = draft.d2t.detach().cpu().to(torch.int64)
    sd["d2t"] = d2t
    V = draft.config.vocab_size
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.arange(d2t.numel()) + d2t] = True
    sd["t2d"] = t2d
    save_file({k: v.cpu() for k, v in sd.items()}, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((Path(src_dir) / "config.json").read_text())
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out_dir


def toy_engine(vocab: int = 16, draft_vocab: int = 12, *, hidden: int = 32, layers: int = 6, max_draft_len: int = 2,
               target_logit_scale: float = 15.0, draft_logit_scale: float = 8.0, seed: int = 0, missing=(3, 7, 11, 13)):
    """An in-memory random pair with a tiny vocabulary (no files, no tokenizer), for statistical tests.

    The target's lm_head is scaled so its distributions are neither uniform nor one-hot; the
    draft vocabulary leaves out the target ids in ``missing`` (q = 0 there).
    Returns (hf_model, engine).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle3_trt.convert.draft_format import DraftConfig
    from eagle3_trt.core.draft import Eagle3Draft
    from eagle3_trt.core.engine import SpeculativeEngine
    from eagle3_trt.core.target import TargetModel

    heads, kv, hd = 4, 2, hidden // 4
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, max_position_embeddings=256,
                      tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(target_logit_scale)
    if layers < 5:
        raise ValueError("toy_engine needs at least 5 layers for three distinct aux layers")
    aux = (1, layers // 2, layers - 2)
    target = TargetModel(hf, aux, cfg.to_dict())
    dc = DraftConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=heads, num_key_value_heads=kv,
                     head_dim=hd, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, max_position_embeddings=256,
                     vocab_size=vocab, draft_vocab_size=draft_vocab, target_hidden_size=hidden, aux_layer_ids=aux,
                     num_aux_layers=len(aux), torch_dtype="float32", source_format="toy")
    torch.manual_seed(seed + 1)
    draft = Eagle3Draft(dc).eval()
    kept = torch.tensor([i for i in range(vocab) if i not in set(missing)][:draft_vocab])
    with torch.no_grad():
        draft.d2t.copy_(kept - torch.arange(draft_vocab))
        draft.lm_head.weight.mul_(draft_logit_scale)
    eng = SpeculativeEngine(target, draft, None, max_draft_len=max_draft_len, eos_token_ids=(), max_seq_len=256)
    return hf, eng
