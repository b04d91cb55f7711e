"""EAGLE-3 training-time test (TTT) on the runtime's own draft module, with resumable checkpoints.

The head is ``core.draft.Eagle3Draft``, i.e. exactly the computation TensorRT-LLM's
one-model worker runs. ModelOpt's HF EAGLE-3 trainer (``mtsp.convert(model, [("eagle", cfg)])``,
0.47) is not used: its first draft layer is a transformers ``LlamaDecoderLayer`` whose own
``input_layernorm`` runs on the hidden branch *before* the EAGLE-3 pre-hook applies
``hidden_norm``, so it trains ``hidden_norm(input_layernorm(h))`` where TensorRT-LLM computes
``hidden_norm(h)`` (checked numerically on a converted tiny target). A head trained there would
be served with a different function than it was trained as; training this module avoids that.

TTT: K draft steps are unrolled over a whole teacher-forced window at once. Step 1 at position t
sees fc(aux_t) and the embedding of token t+1 and predicts the target's distribution at t+1.
Step k feeds the draft's own output of step k-1 from position t-1 (the chain that started from
real features at t-k+1) with the same token embedding and the same label. Its attention sees
what it would see at inference: step-1 keys up to position t-k+1 (the real context) and, for
each later step j <= k, the single key of its own chain at position t-(k-j).

Two ways in: ``Trainer`` (``train-draft``: soft labels, the target's distribution recomputed from
cached hidden states, resumable checkpoints) and ``distill_draft`` (an in-memory engine's draft
distilled onto its target's greedy replies in seconds, for tests, benchmarks and demos on the
random tiny pair). Both run the same TTT unroll (``ttt_unroll``).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, ValidationError
from safetensors.torch import load_file, save_file

from eagle3_trt.atomic import staged_dir, write_text
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine
from eagle3_trt.train import distributed
from eagle3_trt.train.distributed import Dist
from eagle3_trt.train.draft_vocab import DraftVocab, build_draft_vocab, count_tokens
from eagle3_trt.train.hidden_states import HiddenCache


class TrainerState(BaseModel):
    """<ckpt>/state.json: where a run stopped, and the key of the run (same data, target, settings)."""

    model_config = ConfigDict(extra="forbid")

    step: int
    run_key: str
    settings: dict[str, object]
    history: list[dict[str, object]]
    rows_per_rank: list[int] = []  # rows and real tokens each rank has trained on, in rank order
    tokens_per_rank: list[int] = []


def read_trainer_state(ckpt_dir: Path) -> TrainerState | None:
    """The checkpoint's state, or None when there is none or it is unreadable (training starts over)."""
    try:
        return TrainerState.model_validate_json((Path(ckpt_dir) / "state.json").read_text())
    except (OSError, ValidationError):
        return None


@dataclass(frozen=True)
class TrainSettings:
    steps: int
    batch_size: int = 8
    lr: float = 3e-4
    warmup_fraction: float = 0.05
    min_lr_fraction: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    max_draft_len: int = 3
    loss_decay: float = 0.8  # weight of step k is decay**(k-1): early steps decide acceptance most
    seed: int = 0
    save_every: int = 200

    def lr_at(self, step: int) -> float:
        warm = max(1, int(self.warmup_fraction * self.steps))
        if step < warm:
            return self.lr * (step + 1) / warm
        frac = (step - warm) / max(1, self.steps - warm)
        return self.lr * (self.min_lr_fraction + (1 - self.min_lr_fraction) * 0.5 * (1 + math.cos(math.pi * frac)))


@dataclass
class TargetHead:
    """The frozen pieces of the target the draft needs during training."""

    embed: torch.Tensor  # [V, T]
    lm_head: torch.Tensor  # [V, T]
    norm: torch.Tensor | None = None  # final RMSNorm weight [T]


def ttt_mask(seq_len: int, step: int, device=None) -> torch.Tensor:
    """bool [S, step*S], True = may attend; key blocks in the order the KV cache concatenates them."""
    t = torch.arange(seq_len, device=device)
    blocks = [t[None, :] <= (t[:, None] - (step - 1))]
    for j in range(2, step + 1):
        blocks.append(t[None, :] == (t[:, None] - (step - j)))
    return torch.cat(blocks, dim=1)


def ttt_unroll(draft: Eagle3Draft, embeds: torch.Tensor, aux: torch.Tensor, max_draft_len: int) -> list[torch.Tensor]:
    """Draft logits [B, S, D] of steps 1..K over a window; embeds[:, t] embeds token t+1.

    Step k's logits at position t are what inference computes for the k-th draft of the chain
    that starts from the target's real features at position t-k+1 (tests compare both)."""
    B, S, _ = embeds.shape
    positions = torch.arange(S, device=embeds.device)[None].expand(B, S)
    hidden = draft.fuse(aux)
    past = None
    out = []
    for k in range(1, max_draft_len + 1):
        mask = None if k == 1 else ttt_mask(S, k, embeds.device)[None].expand(B, S, k * S)
        h, logits, past = draft(embeds, hidden, positions, past=past, mask=mask)
        out.append(logits)
        hidden = h.roll(1, dims=1)  # step k+1 at t continues the chain of step k at t-1
    return out


# A method's training pass (speculative/<method>/training.py, e.g. parallel groups):
# (draft, next_ids [B,S] = token t+1 at t, the target's embedding table, aux [B,S,A*T], K) -> the
# logits of steps 1..K in ttt_unroll's layout, so the loss and accuracies below apply unchanged.
# None: the EAGLE-3 TTT unroll over the target's embeddings.
Unroll = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor, int], list[torch.Tensor]]


@dataclass
class StepStats:
    loss: torch.Tensor  # mean over this batch's valid positions
    correct: int
    count: int
    loss_sum: torch.Tensor | None = None  # sum over them: ranks of a torchrun run add theirs up


def ttt_forward(
    draft: Eagle3Draft,
    head: TargetHead,
    vocab: DraftVocab,
    batch: dict,
    max_draft_len: int,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    unroll: Unroll | None = None,
) -> list[StepStats]:
    """Loss and teacher-forced top-1 agreement with the target's greedy token, per draft step."""
    ids = batch["input_ids"].to(device)
    real = batch["real"].to(device)
    aux = batch["aux"].to(device, dtype)
    last = batch["last"].to(device)
    t2d = vocab.target_to_draft().to(device)
    keep = vocab.target_ids.to(device)
    with torch.no_grad():
        greedy_rows, prob_rows = [], []
        for row in last:  # one row at a time: [S, V] target logits of a 128k vocabulary are large
            tl = F.linear(row.to(head.lm_head.dtype), head.lm_head).float()
            greedy_rows.append(t2d[tl.argmax(-1)])  # draft id of the target's greedy token, -1 if outside
            prob_rows.append(torch.softmax(tl[:, keep], dim=-1))
        if greedy_rows:
            greedy, tprob = torch.stack(greedy_rows), torch.stack(prob_rows)
        else:  # a rank whose share of a small global batch is empty still joins the collective step
            greedy = torch.empty(last.shape[:2], dtype=torch.long, device=device)
            tprob = torch.empty((*last.shape[:2], keep.numel()), device=device)
        # position t predicts what the target predicts at t+1
        label_p = tprob.roll(-1, dims=1)
        label_g = greedy.roll(-1, dims=1)
        valid = real & real.roll(-1, dims=1) & (label_g >= 0)
        valid[:, -1] = False
    if unroll is None:
        steps = ttt_unroll(draft, F.embedding(ids.roll(-1, dims=1), head.embed).to(dtype), aux, max_draft_len)
    else:
        steps = unroll(draft, ids.roll(-1, dims=1), head.embed, aux, max_draft_len)
    out: list[StepStats] = []
    for k, logits in enumerate(steps, start=1):
        m = valid.clone()
        m[:, : k - 1] = False  # no chain of k steps starts before position 0
        n = int(m.sum())
        if n:
            logp = torch.log_softmax(logits.float(), dim=-1)
            loss_sum = -(label_p * logp).sum(-1)[m].sum()
            correct = int(((logits.argmax(-1) == label_g) & m).sum())
        else:
            loss_sum, correct = logits.sum() * 0.0, 0
        out.append(StepStats(loss=loss_sum / max(n, 1), correct=correct, count=n, loss_sum=loss_sum))
    return out


class TTTLoss(torch.nn.Module):
    """One training step's forward as a module (the draft its only parameters), so DDP and FSDP
    see one forward per backward: the TTT unroll calls the draft K times and its ``fuse`` once."""

    def __init__(self, draft: Eagle3Draft, head: TargetHead, vocab: DraftVocab, max_draft_len: int, device: str, unroll: Unroll | None = None):
        super().__init__()
        self.draft = draft
        self._head, self._vocab, self._k, self._device, self._unroll = head, vocab, max_draft_len, device, unroll

    def forward(self, batch: dict) -> list[StepStats]:
        return ttt_forward(self.draft, self._head, self._vocab, batch, self._k, self._device, unroll=self._unroll)


def new_draft(config, vocab: DraftVocab, head: TargetHead, seed: int) -> Eagle3Draft:
    """A fresh head: random layer, lm_head and norm started from the target's own output head
    (the draft's norm+lm_head play the same role over the same hidden space)."""
    torch.manual_seed(seed)
    m = Eagle3Draft(config).float()
    with torch.no_grad():
        m.get_buffer("d2t").copy_(vocab.d2t())
        if head.lm_head.shape[1] == config.hidden_size:
            m.lm_head.weight.copy_(head.lm_head[vocab.target_ids.to(head.lm_head.device)].float().cpu())
            if head.norm is not None:
                m.norm.weight.copy_(head.norm.float().cpu())
    return m


class Trainer:
    """AdamW + warmup/cosine over the cached hidden states; checkpoints to <work>/ckpt."""

    def __init__(
        self,
        draft: Eagle3Draft,
        head: TargetHead,
        vocab: DraftVocab,
        cache: HiddenCache,
        settings: TrainSettings,
        ckpt_dir: Path,
        device: str = "cpu",
        run_key: str = "",
        dist: Dist | None = None,
        unroll: Unroll | None = None,
    ):
        self.dist = dist or Dist()
        self.dist.check_batch(settings.batch_size)
        self.draft = draft.to(device).float().train()
        self.head = TargetHead(head.embed.to(device), head.lm_head.to(device), head.norm.to(device) if head.norm is not None else None)
        self.vocab = vocab
        self.cache = cache
        self.s = settings
        self.ckpt_dir = Path(ckpt_dir)
        self.device = device
        self.run_key = run_key
        self.step_module = distributed.wrap(TTTLoss(self.draft, self.head, vocab, settings.max_draft_len, device, unroll), self.dist, device)
        # under FSDP the parameters are now shards (DTensors): the optimizer holds the shards
        self.params = {n.removeprefix("draft."): p for n, p in TTTLoss.named_parameters(self._inner()) if p.requires_grad}
        self.opt = torch.optim.AdamW(self.params.values(), lr=settings.lr, weight_decay=settings.weight_decay, betas=(0.9, 0.95))
        self.step = 0
        self.history: list[dict] = []
        self.rows_done = self.tokens_done = 0  # this rank's, over all steps (resumed ones included)
        self.rows_per_rank: list[int] = []
        self.tokens_per_rank: list[int] = []

    def _inner(self) -> TTTLoss:
        m = self.step_module
        return m.module if self.dist.mode == "ddp" else m

    # -- checkpoints (safetensors + json, never pickles) ------------------------------------
    # One checkpoint for any number of processes: full (unsharded) tensors, written by rank 0.
    # Under FSDP every rank takes part in gathering the shards; under DDP every rank holds them all.
    def save(self) -> None:
        opt_t: dict[str, torch.Tensor] = {}
        for name, p in self.params.items():
            st = self.opt.state.get(p)
            if st:
                for k in ("exp_avg", "exp_avg_sq", "step"):
                    opt_t[f"{name}::{k}"] = _full(torch.as_tensor(st[k])).detach().cpu().contiguous()
        weights = {k: v.contiguous() for k, v in self.full_state().items()}
        self._count_ranks()
        state = TrainerState(
            step=self.step,
            run_key=self.run_key,
            settings=asdict(self.s),
            history=self.history,
            rows_per_rank=self.rows_per_rank,
            tokens_per_rank=self.tokens_per_rank,
        )
        if self.dist.main:
            with staged_dir(self.ckpt_dir) as tmp:
                save_file(weights, str(tmp / "draft.safetensors"))
                save_file(opt_t, str(tmp / "optimizer.safetensors"))
                write_text(tmp / "state.json", state.model_dump_json(indent=1) + "\n")
        self.dist.barrier()  # no rank runs ahead of a checkpoint that is not on disk yet

    def resume(self) -> bool:
        """Load <ckpt>/ if it belongs to this run (same data, target, settings); True when loaded."""
        state = read_trainer_state(self.ckpt_dir)
        if state is None or state.run_key != self.run_key:
            return False
        weights = load_file(str(self.ckpt_dir / "draft.safetensors"))
        with torch.no_grad():
            for k, v in self.draft.state_dict().items():
                v.copy_(_like(weights[k], v))
        opt_t = load_file(str(self.ckpt_dir / "optimizer.safetensors"))
        for name, p in self.params.items():
            if f"{name}::exp_avg" in opt_t:
                self.opt.state[p] = {
                    "exp_avg": _like(opt_t[f"{name}::exp_avg"], p),
                    "exp_avg_sq": _like(opt_t[f"{name}::exp_avg_sq"], p),
                    "step": opt_t[f"{name}::step"],
                }
        self.step = state.step
        self.history = list(state.history)
        if len(state.rows_per_rank) == self.dist.world == len(state.tokens_per_rank):
            self.rows_done, self.tokens_done = state.rows_per_rank[self.dist.rank], state.tokens_per_rank[self.dist.rank]
        else:  # resumed with another number of processes: what each did before is not this rank's
            self.rows_done = self.tokens_done = 0
        return True

    def _count_ranks(self) -> None:
        """Gather every rank's row and token counts (a collective every rank joins)."""
        counts = self.dist.per_rank([self.rows_done, self.tokens_done])
        self.rows_per_rank = [c[0] for c in counts]
        self.tokens_per_rank = [c[1] for c in counts]

    def full_state(self) -> dict[str, torch.Tensor]:
        """The head's whole state dict on every rank (under FSDP a collective every rank joins)."""
        return {k: _full(v).detach().cpu() for k, v in self.draft.state_dict().items()}

    # -- training ---------------------------------------------------------------------------
    def train(self, on_step: Callable[[int, dict], None] | None = None) -> list[dict]:
        s = self.s
        use_amp = str(self.device).startswith("cuda")
        try:
            while self.step < s.steps:
                # this rank's share of the global batch, read alone
                batch = self.cache.batch(self.step, s.batch_size, s.seed, self.dist.rows(s.batch_size))
                self.rows_done += int(batch["input_ids"].shape[0])
                self.tokens_done += int(batch["real"].sum())
                for g in self.opt.param_groups:
                    g["lr"] = s.lr_at(self.step)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
                    stats = self.step_module(batch)
                # the loss of the global batch: token sums over all ranks / token counts over all ranks
                totals = self.dist.sum([float(st.count) for st in stats] + [float(st.correct) for st in stats])
                counts, correct = totals[: len(stats)], totals[len(stats) :]
                terms = [(s.loss_decay**i) * st.loss_sum / max(counts[i], 1.0) for i, st in enumerate(stats) if st.loss_sum is not None]
                loss = functools.reduce(operator.add, terms)
                self.opt.zero_grad(set_to_none=True)
                # DDP and FSDP average gradients over ranks; each rank's term is its share of a sum
                (loss * self.dist.world).backward()
                torch.nn.utils.clip_grad_norm_(list(self.params.values()), s.grad_clip)
                self.opt.step()
                self.step += 1
                (loss_value,) = self.dist.sum([float(loss.detach())])
                rec = {"step": self.step, "loss": round(loss_value, 5), "acc": [round(c / max(n, 1.0), 4) for c, n in zip(correct, counts)]}
                if self.step % 10 == 0 or self.step == s.steps:
                    self.history.append(rec)
                if on_step:
                    on_step(self.step, rec)
                if s.save_every and self.step % s.save_every == 0 and self.step < s.steps:
                    self.save()
        except KeyboardInterrupt:
            self.save()  # Ctrl-C keeps the work: --resume continues from here
            raise
        self._count_ranks()
        return self.history


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP shard (a DTensor; a collective), or the tensor itself."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def _like(full: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """A checkpoint's full tensor placed as ``ref`` is (this rank's shard under FSDP)."""
    mesh = getattr(ref, "device_mesh", None)
    if mesh is not None:
        from torch.distributed.tensor import distribute_tensor  # local: only FSDP (DTensor) runs need it

        return distribute_tensor(full.to(ref.dtype), mesh, getattr(ref, "placements"))  # noqa: B009  # a DTensor's
    return full.to(ref.device, ref.dtype)


@torch.no_grad()
def teacher_forced_accuracy(
    draft: Eagle3Draft,
    head: TargetHead,
    vocab: DraftVocab,
    cache: HiddenCache,
    max_draft_len: int,
    batch_size: int = 8,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    unroll: Unroll | None = None,
) -> list[float]:
    """Per-step top-1 agreement with the target's greedy token over a whole cache (no grad)."""
    was = draft.training
    draft.eval()
    correct = [0] * max_draft_len
    count = [0] * max_draft_len
    for batch in cache.iter_all(batch_size):
        for i, st in enumerate(ttt_forward(draft, head, vocab, batch, max_draft_len, device, dtype, unroll)):
            correct[i] += st.correct
            count[i] += st.count
    draft.train(was)
    return [c / n if n else 0.0 for c, n in zip(correct, count)]


def distill_draft(
    engine: SpeculativeEngine,
    prompts: list[list[int]],
    *,
    steps: int = 300,
    gen_tokens: int = 48,
    unroll: int = 3,
    lr: float = 3e-3,
    batch: int = 16,
    seed: int = 0,
    remap_vocab: bool = True,
    embed_dropout: float = 0.0,
    hidden_only: bool = False,
) -> list[float]:
    """Train ``engine.draft`` in place on ``engine.target``'s greedy continuations of ``prompts``.

    A random (tiny) pair's draft accepts nothing, so every acceptance figure is 0; a few hundred
    steps of this give a draft that really predicts the target, which tests, benchmarks and
    demos use to exercise accepted tokens and the alpha tooling with non-zero figures. Not a
    training recipe for real models (that is ``train-draft``). The TTT unroll is ``ttt_unroll``;
    labels are the continuation's own (greedy) tokens.

    ``remap_vocab`` points the draft vocabulary at the tokens the continuations use most
    (``build_draft_vocab``, the stop tokens always kept). ``embed_dropout`` zeroes the
    token-embedding input of whole positions, which pushes the draft to rely on the target's
    hidden states; ``hidden_only`` removes the token input altogether (input_layernorm weight
    fixed at 0), so the draft predicts from the target's aux states and its own hidden state
    only, as a real draft largely does on a real target. Returns the loss history.
    """
    draft = engine.draft
    if draft is None:
        raise ValueError("distill_draft needs an engine with a draft")
    embeds, aux, labels = _distill_data(engine, draft, prompts, gen_tokens, remap_vocab)
    return _distill_steps(draft, embeds, aux, labels, steps, unroll, lr, batch, seed, embed_dropout, hidden_only)


def _distill_data(
    engine: SpeculativeEngine, draft: Eagle3Draft, prompts: list[list[int]], gen_tokens: int, remap_vocab: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target's greedy continuations as TTT inputs: token embeddings, aux hidden states, draft-vocabulary labels."""
    target, dev = engine.target, engine.device
    d2t = draft.get_buffer("d2t")
    res = engine.generate(prompts, SamplingParams(max_tokens=gen_tokens), speculate=False)
    seqs = [p + r.token_ids for p, r in zip(prompts, res)]
    if remap_vocab:
        vocab = build_draft_vocab(count_tokens(r.token_ids for r in res), target.vocab_size, draft.config.draft_vocab_size, engine.eos_token_ids)
        with torch.no_grad():
            d2t.copy_(vocab.d2t().to(d2t.device))
        engine.refresh_draft_vocab()
    t2d = DraftVocab.from_d2t(d2t.cpu(), target.vocab_size).target_to_draft().to(dev)

    N = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), N), engine.pad_token_id, dtype=torch.long)
    lens = torch.tensor([len(s) for s in seqs])
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
    aux, _ = target.teacher_forced(ids)
    ids, S = ids.to(dev), N - 1
    aux = aux[:, :S]
    # TTT position t (state of position t, token t+1) predicts token t+2 at every step
    labels = torch.full((len(seqs), S), -100, dtype=torch.long, device=dev)
    labels[:, : S - 1] = t2d[ids[:, 2:]]
    labels[labels < 0] = -100  # outside the draft vocabulary
    labels[(torch.arange(S, device=dev)[None] + 2) >= lens.to(dev)[:, None]] = -100
    embeds = engine.draft_embedding(ids[:, 1:]).detach()  # the embedding is the target's, frozen
    return embeds, aux, labels


def _distill_steps(
    draft: Eagle3Draft,
    embeds: torch.Tensor,
    aux: torch.Tensor,
    labels: torch.Tensor,
    steps: int,
    unroll: int,
    lr: float,
    batch: int,
    seed: int,
    embed_dropout: float,
    hidden_only: bool,
) -> list[float]:
    n = embeds.shape[0]
    g = torch.Generator().manual_seed(seed)
    was_training = draft.training
    draft.train()
    if hidden_only:
        with torch.no_grad():
            draft.first_layer.input_layernorm.weight.zero_()
    params = [p for n_, p in draft.named_parameters() if not (hidden_only and n_ == "midlayer.input_layernorm.weight")]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    hist = []
    for _ in range(steps):
        idx = torch.randperm(n, generator=g)[:batch]
        e = embeds[idx]
        if embed_dropout > 0:
            keep = (torch.rand(e.shape[:-1], generator=g) >= embed_dropout).to(e.device, e.dtype)
            e = e * keep[..., None]
        outs = ttt_unroll(draft, e, aux[idx], unroll)
        loss = functools.reduce(
            operator.add,
            [F.cross_entropy(o[:, k:].float().flatten(0, 1), labels[idx][:, k:].flatten(), ignore_index=-100) * (0.8**k) for k, o in enumerate(outs)],
        )  # step k+1 starts its chain at position k
        opt.zero_grad()
        loss.backward()
        opt.step()
        hist.append(float(loss.detach()))
    for p in params:
        p.requires_grad_(False)
    draft.train(was_training)
    draft.eval()
    return hist
