"""`plan MODEL --train --records N`: what retraining the EAGLE-3 head on N records costs, from config files alone.

Three figures, each with the arithmetic that makes it (order-of-magnitude planning, not promises):

- hidden-state storage: the cache of formats/hidden_states.py holds, per token, the A aux layers
  and the post-norm last state in bf16 plus the token id and mask: (A+1) * T * 2 + 9 bytes.
  ModelOpt's and speculators' offline formats hold the same tensors (within a few bytes per token).
- GPU memory per rank for each hidden-state backend (train/hs_backends.py):
  - reference: the whole target in BF16 on one device, plus one batch's activations;
  - hf (``device_map="auto"``): the BF16 weights spread over the node's GPUs, plus on each GPU the
    ``output_hidden_states`` it keeps (its share of the L+1 layer outputs of a batch) and one
    layer's MLP transient; only one GPU computes at a time (layers run in sequence);
  - trtllm (``SaveHiddenStatesDecodingConfig``): the deployment plan's weights per GPU at its TP and
    quantization (the states of the target as it is served), the writer's capture buffer
    ``[max_num_tokens, (A+1) * T]`` (save_hidden_state.py's resource manager) and the plan's reserve;
    the rest is KV cache. ``hidden-states collect --backend trtllm`` builds ONE model at the
    bundle's TP and sends one window per request, in order (train/hs_collect.py): one TP group
    computes, whatever the node's other GPUs (HS_COLLECT_INSTANCES).
  and for training the head under torchrun (train/distributed.py, whose docstring says what each
  wrapping holds): the trainable state (fp32 weights, gradients, AdamW moments: 16 B/param) whole on
  every rank plus DDP's gradient buckets (every gradient copied once more, 4 B/param) under DDP; under
  FSDP (one unit: the whole head) the 16 B/param divided by the ranks plus the whole weights and
  gradients between the all-gather and the reduce-scatter (8 B/param); on every rank the target's
  frozen embedding and lm_head in BF16 (the TTT inputs and the labels), and the activations of the
  K-step TTT unroll of one rank's share of a batch (``train_memory_per_rank`` lists them). ``train_steps`` is one pass over the records
  ``epochs`` times at the global batch: the ``--steps`` of the runbook's command.
- time: hidden states at 2 * params FLOP per token at a model-FLOP utilisation (one GPU at a time
  for hf; the one TP group for trtllm), plus writing the cache; training at 3 x the forward
  FLOP of K draft steps per token plus the label recomputation (the target's lm_head), on all
  ranks, plus reading the cache once per epoch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.gpus import get_gpu
from eagle3_trt.pipeline.model_size import BF16_BYTES, EAGLE3_CAPTURED_LAYERS, GB, count_draft, count_target, gb, parse_shape
from eagle3_trt.pipeline.plan_report import DISK_BYTES_PER_S, _duration
from eagle3_trt.pipeline.planner import Plan

HS_BYTES_PER_TOKEN_EXTRA = 9  # int64 token id + bool mask
TRAIN_BYTES_PER_PARAM = 16  # train/distributed.py: fp32 weight + grad + AdamW exp_avg + exp_avg_sq
DDP_BUCKET_BYTES_PER_PARAM = 4  # train/distributed.py: torch's buckets hold a copy of every fp32 gradient
FSDP_UNSHARDED_BYTES_PER_PARAM = 8  # train/distributed.py: one FSDP unit, whole fp32 weights + gradients
HS_COLLECT_INSTANCES = 1  # train/hs_collect.py: one LLM (one TP group), one request at a time
PREFILL_MFU = 0.35  # teacher-forced prefill: large matmuls (TensorRT-LLM; HF eager a little less)
HF_MFU = 0.25
TRAIN_MFU = 0.25  # the head: one decoder layer, a 32k lm_head, softmaxes over the draft vocabulary
HS_BATCH = 8  # windows per teacher-forced batch (hidden-states collect --batch-size)
USABLE = 0.90  # of a GPU's memory, the rest for the CUDA context and fragmentation


@dataclass(frozen=True)
class BackendMemory:
    backend: str
    gpus: int  # GPUs the backend uses
    bytes_per_gpu: int
    fits: bool
    note: str


@dataclass(frozen=True)
class TrainPlan:
    records: int
    seq_len: int
    tokens: int
    epochs: int
    aux_layers: int
    hidden_size: int
    hs_bytes_per_token: int
    hs_storage_bytes: int
    backends: tuple[BackendMemory, ...]
    draft_params: int
    train_ranks: int
    train_mode: str  # ddp | fsdp
    train_batch: int
    train_steps: int  # --steps of one run over the records, epochs times, at train_batch
    train_frozen_bytes: int  # per rank: the target's embedding + lm_head, BF16
    train_activation_bytes: int  # per rank: one share of a batch through the TTT unroll
    train_bytes_per_rank_ddp: int
    train_bytes_per_rank_fsdp: int
    hs_seconds: dict[str, float | None]
    train_seconds: float

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["backends"] = [asdict(b) for b in self.backends]
        return d


def make_train_plan(
    plan: Plan, target_cfg: dict[str, Any], draft_cfg: dict[str, Any], records: int, seq_len: int, epochs: int = 1, batch: int = 8
) -> TrainPlan:
    if records < 1:
        raise UserError("--records", f"{records} is not a positive number of records", "e.g. --records 50000")
    if seq_len < 2 or epochs < 1 or batch < 1:
        raise UserError("--train-seq-len/--epochs/--train-batch-size", "must be positive (seq-len at least 2)", "e.g. --train-seq-len 2048 --epochs 1")
    gpu = get_gpu(plan.gpu)
    s = parse_shape(target_cfg, "target config.json")
    tp = count_target(s)
    dp = count_draft(draft_cfg, s)
    A, T, G, K = EAGLE3_CAPTURED_LAYERS, s.hidden, plan.num_gpus, max(plan.max_draft_len, 1)
    tokens = records * seq_len
    per_tok = (A + 1) * T * BF16_BYTES + HS_BYTES_PER_TOKEN_EXTRA
    storage = tokens * per_tok
    usable = int(gpu.memory_bytes * USABLE)

    # -- hidden-state backends --------------------------------------------------------------
    act_tokens = HS_BATCH * seq_len
    layer_transient = act_tokens * (T * 4 + s.intermediate * 3) * BF16_BYTES  # one layer: residual, norms, gate/up/act
    bf16_weights = tp.total * BF16_BYTES
    ref_bytes = bf16_weights + act_tokens * (A + 1) * T * BF16_BYTES + layer_transient
    hf_bytes = bf16_weights // G + act_tokens * (s.layers + 1) * T * BF16_BYTES // G + layer_transient
    capture = plan.max_num_tokens * (A + 1) * T * BF16_BYTES
    trt_bytes = plan.target_weight_bytes_per_gpu + capture + plan.reserve.total
    backends = (
        BackendMemory("reference", 1, ref_bytes, ref_bytes <= usable, "whole BF16 target on one device"),
        BackendMemory("hf", G, hf_bytes, hf_bytes <= usable, f'device_map="auto" over {G} GPUs, BF16; one GPU computes at a time'),
        BackendMemory(
            "trtllm",
            HS_COLLECT_INSTANCES * plan.tp * plan.pp,
            trt_bytes,
            trt_bytes <= gpu.memory_bytes,
            f"{HS_COLLECT_INSTANCES} instance of TP{plan.tp} {plan.quant} as served (SaveHiddenStatesDecodingConfig), one window per request "
            f"+ capture buffer {gb(capture)}; the rest is KV cache",
        ),
    )
    fwd = 2 * tp.total * tokens
    write_s = storage / DISK_BYTES_PER_S
    hs_seconds: dict[str, float | None] = {
        "reference": fwd / (gpu.bf16_tflops * 1e12 * PREFILL_MFU) + write_s if backends[0].fits else None,
        "hf": fwd / (gpu.bf16_tflops * 1e12 * HF_MFU) + write_s if backends[1].fits else None,
        # the collector's one TP group computes every window
        "trtllm": fwd / (HS_COLLECT_INSTANCES * plan.tp * _tflops(gpu, plan.quant) * 1e12 * PREFILL_MFU) + write_s if backends[2].fits else None,
    }

    # -- training under torchrun ------------------------------------------------------------
    trainable = dp.total
    local_batch = max(1, -(-batch // G))
    mem = train_memory_per_rank(trainable, s.vocab, T, s.intermediate, dp.draft_vocab, K, seq_len, local_batch, G)
    frozen, act, ddp, fsdp = mem["frozen"], mem["activations"], mem["ddp"], mem["fsdp"]
    mode = "ddp" if trainable * TRAIN_BYTES_PER_PARAM <= gpu.memory_bytes // 2 else "fsdp"  # train/distributed.choose_mode
    draft_fwd = 2 * (dp.total - dp.fc) * K + 2 * dp.fc  # fc once, the layer and lm_head K times
    train_flop = epochs * tokens * (3 * draft_fwd + 2 * s.vocab * T)
    train_s = train_flop / (G * gpu.bf16_tflops * 1e12 * TRAIN_MFU) + epochs * storage / DISK_BYTES_PER_S
    return TrainPlan(
        records=records,
        seq_len=seq_len,
        tokens=tokens,
        epochs=epochs,
        aux_layers=A,
        hidden_size=T,
        hs_bytes_per_token=per_tok,
        hs_storage_bytes=storage,
        backends=backends,
        draft_params=trainable,
        train_ranks=G,
        train_mode=mode,
        train_batch=batch,
        train_steps=-(-records * epochs // batch),
        train_frozen_bytes=frozen,
        train_activation_bytes=act,
        train_bytes_per_rank_ddp=ddp,
        train_bytes_per_rank_fsdp=fsdp,
        hs_seconds=hs_seconds,
        train_seconds=train_s,
    )


def train_memory_per_rank(
    trainable: int,
    vocab: int,
    hidden: int,
    intermediate: int,
    draft_vocab: int,
    K: int,
    seq_len: int,
    local_batch: int,
    ranks: int,
    frozen_bytes: int = BF16_BYTES,
    act_bytes: int = BF16_BYTES,
) -> dict[str, int]:
    """Bytes one rank holds training the head (see the module docstring): the frozen embedding and
    lm_head, the TTT activations of ``local_batch`` rows, and the whole under DDP and under FSDP.
    ``frozen_bytes``/``act_bytes``: 2 on a GPU (BF16, autocast); 4 on CPU, where the trainer runs fp32."""
    frozen = (vocab * hidden * 2) * frozen_bytes  # target embedding + lm_head
    # What autograd keeps per token (core/draft.py, train/trainer.ttt_forward), the query width
    # being the hidden size (Llama): at every draft step k the layer's saved tensors, 11 of width T
    # (the norms' inputs and normalised values, [embedding, hidden] of width 2T, the residual sums,
    # the rolled hidden state), 3 of the query width (rotated q, attention output and its reshape),
    # 4 of width I (gate, up, silu, product), the keys and values repeated over the k*S keys the
    # step attends (2k of the query width), the draft-vocabulary logits and their fp32
    # log-softmax (with an fp32 copy of the logits under autocast); once per token the fc's input
    # (3T) and the label distribution and its shifted copy (2 x fp32 over the draft vocabulary);
    # and one row's target logits over the whole vocabulary (fp32), computed before the unroll.
    logits = draft_vocab * (act_bytes + 4 + (4 if act_bytes < 4 else 0))
    per_token = sum((11 * hidden + 3 * hidden + 2 * k * hidden + 4 * intermediate) * act_bytes + logits for k in range(1, K + 1))
    per_token += 3 * hidden * act_bytes + 2 * draft_vocab * 4
    act = local_batch * seq_len * per_token + seq_len * vocab * 4
    ddp = trainable * (TRAIN_BYTES_PER_PARAM + DDP_BUCKET_BYTES_PER_PARAM) + frozen + act
    fsdp = trainable * TRAIN_BYTES_PER_PARAM // ranks + trainable * FSDP_UNSHARDED_BYTES_PER_PARAM + frozen + act
    return {"frozen": frozen, "activations": act, "ddp": ddp, "fsdp": fsdp}


def _tflops(gpu, quant: str) -> float:
    if quant == "fp8" and gpu.fp8_tflops:
        return float(gpu.fp8_tflops)
    if quant == "nvfp4" and gpu.fp4_tflops:
        return float(gpu.fp4_tflops)
    return float(gpu.bf16_tflops)


def format_train_plan(tp: TrainPlan, plan: Plan) -> str:
    lines = [
        f"train plan: {tp.records:,} records x {tp.seq_len} tokens = {tp.tokens:,} tokens, {tp.epochs} epoch(s), on {plan.num_gpus}x {plan.gpu} "
        "(config files only; responses regenerated by the serving engine, --endpoint)",
        f"  hidden states  {tp.aux_layers} aux layers + post-norm last, T={tp.hidden_size}, bf16: {tp.hs_bytes_per_token:,} bytes/token "
        f"-> {gb(tp.hs_storage_bytes)} on disk (ModelOpt / speculators formats: the same tensors)",
    ]
    for b in tp.backends:
        secs = tp.hs_seconds[b.backend]
        when = _duration(secs) if secs is not None else "does not fit"
        lines.append(
            f"  backend {b.backend:<9} {gb(b.bytes_per_gpu)} per GPU on {b.gpus} GPU(s) ({'fits' if b.fits else 'DOES NOT FIT'} "
            f"{plan.gpu_memory_bytes / GB:.2f} GB{'' if b.backend == 'trtllm' else f', {USABLE:.0%} usable'}): {when}; {b.note}"
        )
    lines += [
        f"  train          head {tp.draft_params / 1e9:.2f} B params under torchrun --nproc-per-node {tp.train_ranks} ({tp.train_mode} chosen), "
        f"--batch-size {tp.train_batch} --steps {tp.train_steps}: per rank DDP {gb(tp.train_bytes_per_rank_ddp)} (with its gradient buckets), "
        f"FSDP {gb(tp.train_bytes_per_rank_fsdp)} (one unit: whole weights and gradients at the peak); {_duration(tp.train_seconds)}",
    ]
    return "\n".join(lines)
