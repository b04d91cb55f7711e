"""Behaviour checks: does the pair *behave* like a trained target and its own head?

``validate`` reads files, so two swaps pass it: a tokenizer replaced by another of the same size
and special ids (the target then reads unrelated ids and predicts nothing), and a head trained for
another target of the same shape (it reads the target's aux states as noise). Both build, and the
first sign would be a near-zero alpha on a GPU. Two figures, measured on the calibration prompts
(the build's ``--calib`` file, through the target's chat template as calibration encodes them):

- the target's mean next-token loss, against log V (the loss of a uniform guess over the V ids):
  a trained model is far below it; one fed the wrong tokenizer's ids is near or above it;
- the draft's top-1 agreement with the target's own next token (its argmax), teacher-forced
  draft step 1 as TensorRT-LLM runs it (embedding of token p+1, fused aux states of position p),
  against chance, 1 / draft_vocab_size.

This is a small extra pass of the reference runtime (convert/load.py, core/) over the first few
calibration prompts, run before the calibration load: hooking ModelOpt's calibration forward would
measure nothing in BF16/native builds (which load no model for calibration), and
validate --deep needs the same figures with no build at all. The target is freed before the
build loads it for calibration, so peak memory is one copy.

Margins, measured with `eagle3-trt validate --deep --target T --draft D` (CPU, float32, the first
8 shipped calibration prompts through the chat template; tests/test_behaviour_checks.py builds the
broken cases):

==========================================================  ==============  ==================
pair                                                        loss / log V    agreement (x chance)
==========================================================  ==============  ==================
models/tiny (Llama, log V 7.62, draft vocab 1024)           0.97            0.407 (417x)
models/tiny-qwen3 (log V 6.93, draft vocab 512)             0.97            0.442 (226x)
models/tiny-gpt-oss (log V 6.93, draft vocab 512)           0.94            0.868 (444x)
tiny, vocabulary ids permuted (specials kept)               1.45            -
tiny-qwen3, vocabulary ids permuted                         1.29            -
tiny-gpt-oss, vocabulary ids permuted                       1.30            -
tiny-qwen3 target + tiny-gpt-oss head (same shapes)         0.97            0.138 (70x)
tiny-gpt-oss target + tiny-qwen3 head (same shapes)         0.94            0.011 (5x)
==========================================================  ==============  ==================

The tiny targets were trained on Python source, so English chat prompts are far from their data
and their loss sits just under log V; a real chat model is at a fraction of it (a few nats against
log V ~ 11-12). A permuted vocabulary puts the loss *above* log V (the model is confidently wrong),
so the loss bound is log V plus 10%: no better than a uniform guess, with room for the tiny
models. The agreement bound, 120x chance, sits between the worst trained head (226x) and the best
wrong one (70x). With a large draft vocabulary (32k) 120x chance is a low bar (0.4%): the check
then catches a head that reads the target's states as noise, not one for a closely related target.
"""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from eagle3_trt.convert.draft_format import DraftCheckpoint, head_hooks
from eagle3_trt.convert.load import engine_for_checkpoint
from eagle3_trt.convert.prompts import load_prompts
from eagle3_trt.convert.quantize import calibration_batches
from eagle3_trt.convert.validate_report import ValidationReport
from eagle3_trt.core.engine import SpeculativeEngine
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import read_json, weight_files

# Set to 1 to skip the checks (as --skip-behaviour-checks does): for pairs with random weights, such
# as the test suite's eagle3_trt.testing.tiny_pair, which they rightly refuse. The skip is recorded.
SKIP_ENV = "EAGLE3_TRT_SKIP_BEHAVIOUR_CHECKS"

# At most this many calibration prompts are run (a few seconds on a CPU for the tiny pairs; the
# figures are means over hundreds of positions, far from the margins below).
LOSS_PROMPTS = 8
AGREEMENT_PROMPTS = 8
MAX_TOKENS = 256  # per prompt; the calibration length when shorter

# A trained target's loss is at most this fraction of log V; refused above it.
MAX_LOSS_RATIO = 1.1
# A trained head's agreement is at least this many times chance; refused below it.
MIN_AGREEMENT_OVER_CHANCE = 120.0


@dataclass(frozen=True)
class TargetLoss:
    """Mean next-token cross-entropy (nats) of the target over the prompts' tokens."""

    nats: float
    log_vocab: float  # log V: the loss of a uniform guess
    tokens: int  # positions scored
    prompts: int

    @property
    def ratio(self) -> float:
        return self.nats / self.log_vocab


@dataclass(frozen=True)
class DraftAgreement:
    """Fraction of positions where the draft's step-1 top-1 (mapped to target ids) is the target's argmax."""

    agreement: float
    draft_vocab: int
    positions: int
    prompts: int

    @property
    def chance(self) -> float:
        return 1.0 / self.draft_vocab

    @property
    def over_chance(self) -> float:
        return self.agreement / self.chance


@dataclass(frozen=True)
class Behaviour:
    loss: TargetLoss
    agreement: DraftAgreement
    prompts_file: str
    # a method head drafting later slots from its own inputs (e.g. mask slots): their agreement, slot 2..K
    later_slots: tuple[float, ...] = ()

    def record(self) -> dict[str, float | int | str | list[float]]:
        """The figures as the bundle's validation record stores them."""
        return {
            "prompts_file": self.prompts_file,
            "target_loss_nats": round(self.loss.nats, 4),
            "log_vocab": round(self.loss.log_vocab, 4),
            "loss_ratio": round(self.loss.ratio, 4),
            "loss_tokens": self.loss.tokens,
            "loss_prompts": self.loss.prompts,
            "draft_agreement": round(self.agreement.agreement, 4),
            "chance": round(self.agreement.chance, 6),
            "agreement_over_chance": round(self.agreement.over_chance, 2),
            "agreement_positions": self.agreement.positions,
            "agreement_prompts": self.agreement.prompts,
            **({"later_slot_agreement": [round(a, 4) for a in self.later_slots]} if self.later_slots else {}),
        }


def skipped_by_env() -> bool:
    return os.environ.get(SKIP_ENV, "") not in ("", "0")


def _does_not_fit(target_dir: Path, device: str) -> str | None:
    """Why the target cannot be measured here, or None. The reference runtime holds the whole target
    on one device in the measuring dtype (bf16 on a GPU, float32 on a CPU; a shipped-quantized target
    such as gpt-oss MXFP4 dequantized, ~4x its files); a target the build spreads over several GPUs
    (device_map="auto") would run out of memory instead of being measured."""
    files = sum(f.stat().st_size for f in weight_files(target_dir))
    quantized = (target_dir / "hf_quant_config.json").is_file() or "quantization_config" in read_json(target_dir / "config.json")
    need = files * (4 if quantized else 1) * (2 if device == "cpu" else 1)
    if device.startswith("cuda"):
        free = torch.cuda.mem_get_info()[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need * 1.2 <= free:
        return None
    return (
        f"the target needs ~{need / 2**30:.1f} GiB on one {device} and {free / 2**30:.1f} GiB are free: the checks run the reference runtime on "
        "one device (run `eagle3-trt validate --deep` on a machine that holds it)"
    )


# a method head's later draft slots over a window (its head hooks' ``slot_logits``): (draft, next_ids, aux, K) ->
# draft logits of slots 1..K in train-draft's TTT layout (slot k at t is labelled with the target's argmax at t+1)
SlotLogits = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, int], list[torch.Tensor]]


@torch.no_grad()
def later_slot_agreement(engine: SpeculativeEngine, batches: list[torch.Tensor], slots: SlotLogits, k: int, prompts: int = AGREEMENT_PROMPTS) -> list[float]:
    """Teacher-forced top-1 agreement of draft slots 2..k with the target's argmax, on the target's own hidden
    states (slot k at position t belongs to the group anchored at t-k+1, so t >= k-1)."""
    target, draft = engine.target, engine.draft
    assert draft is not None
    agree, count = [0] * (k - 1), [0] * (k - 1)
    for ids in [b for b in batches if b.shape[1] >= k + 2][:prompts]:
        aux, h = target.teacher_forced(ids)
        want = target.hf.lm_head(h).float()[0].argmax(-1)  # [n]: the target's next token after each position
        steps = slots(draft, ids[:, 1:], aux[:, :-1].to(draft.fc.weight.dtype), k)
        for s in range(2, k + 1):
            guess = draft.to_target_ids(steps[s - 1][0].argmax(-1)).to(want.device)  # [n-1]: position t predicts want[t+1]
            t = torch.arange(s - 1, guess.shape[0] - 1, device=want.device)
            agree[s - 2] += int((guess[t] == want[t + 1]).sum())
            count[s - 2] += int(t.numel())
    return [a / c if c else 0.0 for a, c in zip(agree, count)]


@torch.no_grad()
def measure(engine: SpeculativeEngine, batches: list[torch.Tensor], agreement_prompts: int = AGREEMENT_PROMPTS) -> tuple[TargetLoss, DraftAgreement]:
    """Both figures from one teacher-forced target pass per prompt ([1, n] id tensors)."""
    target, draft = engine.target, engine.draft
    assert draft is not None  # the engine is built from a pair
    nll, scored, agree, positions, used = 0.0, 0, 0, 0, 0
    for i, ids in enumerate(batches):
        if ids.shape[1] < 3:  # a draft query needs a token after it and one to predict
            continue
        used += 1
        aux, h = target.teacher_forced(ids)
        logits = target.hf.lm_head(h).float()[0]  # [n, V]
        tgt = ids[0].to(logits.device)
        nll += float(F.cross_entropy(logits[:-1], tgt[1:], reduction="sum"))
        scored += ids.shape[1] - 1
        if i >= agreement_prompts:
            continue
        # draft query p reads token p+1 and aux state p, and predicts token p+2: the target's argmax at p+1
        n = ids.shape[1] - 1
        pos = torch.arange(n, device=draft.device)[None]
        _h, dlogits, _kv = draft(engine.draft_embedding(ids[:, 1:]).to(draft.fc.weight.dtype), None, pos, aux=aux[:, :-1].to(draft.fc.weight.dtype))
        assert dlogits is not None
        guess = draft.to_target_ids(dlogits[0].argmax(-1)).to(logits.device)
        agree += int((guess[:-1] == logits[1:-1].argmax(-1)).sum())
        positions += n - 1
    if not scored or not positions:
        raise UserError("calibration prompts", "no prompt is 3 tokens or longer", "pass a --calib file with longer prompts")
    loss = TargetLoss(nats=nll / scored, log_vocab=math.log(target.vocab_size), tokens=scored, prompts=used)
    agreement = DraftAgreement(
        agreement=agree / positions, draft_vocab=draft.config.draft_vocab_size, positions=positions, prompts=min(used, agreement_prompts)
    )
    return loss, agreement


def check_behaviour(
    target_dir: Path,
    draft: DraftCheckpoint,
    aux_layer_ids: tuple[int, ...],
    prompts_file: Path,
    max_length: int,
    rep: ValidationReport,
    device: str | None = None,
) -> Behaviour | None:
    """Measure, refuse a pair outside the margins (UserError naming the file and the figure),
    record the figures in ``rep``. The target is freed on return. None (the skip recorded in
    ``rep`` with a warning) when the target does not fit on one device."""
    target_dir = Path(target_dir)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")  # where the build calibrates (build_checkpoints)
    too_big = _does_not_fit(target_dir, device)
    if too_big:
        rep.behaviour = {"skipped": too_big}
        rep.warn(f"behaviour checks skipped: {too_big}")
        return None
    engine = engine_for_checkpoint(target_dir, draft, device=device, aux_layer_ids=aux_layer_ids)
    try:
        prompts = load_prompts(prompts_file, LOSS_PROMPTS, option="--calib")
        if engine.tokenizer is None:
            raise UserError(target_dir, "no tokenizer.json or tokenizer.model", "behaviour checks encode the calibration prompts with the target's tokenizer")
        batches = calibration_batches(engine.tokenizer, prompts, min(max_length, MAX_TOKENS))
        loss, agreement = measure(engine, batches)
        hooks = head_hooks(draft)
        later = tuple(later_slot_agreement(engine, batches, hooks.slot_logits, hooks.trained_k(draft))) if hooks is not None else ()
    finally:
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    result = Behaviour(loss=loss, agreement=agreement, prompts_file=str(prompts_file), later_slots=later)
    if loss.ratio > MAX_LOSS_RATIO:
        raise UserError(
            target_dir / "tokenizer.json",
            f"the target's next-token loss on {loss.prompts} calibration prompts is {loss.nats:.2f} nats, {loss.ratio:.2f} of log V = {loss.log_vocab:.2f} "
            f"(a trained model reading its own tokens is below log V: refused above {MAX_LOSS_RATIO}x log V): is the tokenizer the model's own?",
            "ship the tokenizer the target was trained with (tokenizer.json, tokenizer_config.json) in the target directory",
        )
    if agreement.over_chance < MIN_AGREEMENT_OVER_CHANCE:
        raise UserError(
            draft.path,
            f"the draft's top-1 agreement with the target's next token on {agreement.prompts} calibration prompts is {agreement.agreement:.3f}, "
            f"{agreement.over_chance:.1f}x chance (1/{agreement.draft_vocab} = {agreement.chance:.4f}; a head trained for this target is far above: "
            f"refused below {MIN_AGREEMENT_OVER_CHANCE:g}x chance): was this head trained for this target?",
            "use the EAGLE-3 head trained for this exact target checkpoint (same weights, same aux layers)",
        )
    later_line = ""
    if later:
        later_line = f"; later draft slots (the head's own inputs) {' / '.join(f'{a:.3f}' for a in later)}"
        weak = [i + 2 for i, a in enumerate(later) if a * agreement.draft_vocab < MIN_AGREEMENT_OVER_CHANCE]
        if weak:  # served and measured as it is (slot 1 is the refusal's evidence); said, since those slots will rarely be accepted
            rep.warn(f"draft slot(s) {weak} agree with the target below {MIN_AGREEMENT_OVER_CHANCE:g}x chance: was the head trained for them?")
    rep.ok(
        "behaviour",
        f"target loss {loss.nats:.2f} nats = {loss.ratio:.2f} of log V ({loss.log_vocab:.2f}) on {loss.tokens} tokens; "
        f"draft top-1 agreement {agreement.agreement:.3f} = {agreement.over_chance:.0f}x chance on {agreement.positions} positions" + later_line,
    )
    rep.behaviour = result.record()
    return result
