"""MODEL_CARD.md of an embedded tiny pair, written from the facts make_tiny_pair records (tiny_pair.json)."""

from __future__ import annotations

from eagle3_trt.formats.families import family_of


def model_card(f: dict) -> str:
    r = f["recipe"]
    acc = f["acceptance_heldout"]
    k = f"K={r['max_draft_len']}"
    main = acc[k]
    rows = "\n".join(
        f"| {key} | {a['acceptance_length']:.2f} | {' / '.join(f'{x:.2f}' for x in a['per_step'])} | {a['iterations']} | {a['tokens']} |"
        for key, a in acc.items()
        if key.startswith("K=")
    )
    greedy_line = "Output equals the target's plain greedy decoding (checked on the first 4 prompts)." if acc.get("matches_greedy_first_4_prompts") else ""
    t = f["timings"]
    mb = 1 << 20
    files = "weights (target experts MXFP4 as shipped, dequantized exactly; the rest bf16)" if r.get("target_format") == "mxfp4" else "bf16 weights"
    family = family_of(r.get("model_type", "llama"))
    aux = ", ".join(map(str, family.default_aux_layers(r["num_hidden_layers"])))
    quirks = (
        f"; per-head q/k RMSNorm, {r['num_attention_heads']} heads x head_dim {r['head_dim']} over hidden {r['hidden_size']}" if family.qk_norm else ""
    ) + ("; lm_head tied to the embedding" if r.get("tie_word_embeddings") else "")
    if r.get("num_local_experts"):
        quirks += (
            f"; MoE: {r['num_local_experts']} experts, {r['num_experts_per_tok']} per token"
            + ("; attention sinks" if family.attention_sinks else "")
            + (f"; {r['sliding_window']}-token sliding window on the even layers" if r.get("sliding_window") else "")
            + (f"; yarn rope x{r['yarn_factor']:g}" if r.get("yarn_factor") else "")
            + ("; experts shipped in MXFP4" if r.get("target_format") == "mxfp4" else "")
        )
    raw_note = (
        " (training on the raw text instead gave 2.03 at K=3 in an earlier run)"
        if family.name == "llama"
        else f". This target is trained only briefly (held-out loss {f['target']['heldout_loss']} nats/token): its greedy "
        "output repeats a few frequent tokens, which is why a head trained for a minute predicts most of it"
    )
    return f"""# Embedded tiny EAGLE-3 pair

A small {family.name} target (`{family.hf_class}`) trained on Python standard-library source, and an EAGLE-3 draft
head trained for it with `eagle3-trt train-draft`'s code path. It exists so that every stage
(quantization, acceptance measurement, serving, benchmarks) runs on a CPU with a real, measured
acceptance rate. It is not a useful code model: its greedy continuations are often repetitive
(runs of comment lines, repeated statements), which is part of why a one-layer head can predict
them. The figure shows that the head tracks this target, not that the target is good.

**Measured greedy acceptance length on held-out text: {main["acceptance_length"]:.2f} tokens per target pass**
(max_draft_len {r["max_draft_len"]}; {main["prompts"]} prompts of {r["eval_prompt_len"]} tokens from held-out files, {r["eval_tokens"]} generated
tokens each; greedy speculative decoding of the committed {files}, computed in float32, on a CPU;
`eagle3_trt.train.evaluate.measure_acceptance`; acceptance length = generated tokens per target
forward, the prefill included). {greedy_line}
The decoding is the runtime's own loop (`eagle3_trt.core.engine.SpeculativeEngine`); its accept lengths are
checked against an independent re-derivation in `tests/test_engine_cross_check.py`.

| drafts per pass | acceptance length | per-step acceptance | verification passes | tokens |
|---|---|---|---|---|
{rows}

## Architecture

| | target (`target/`) | draft (`draft/`) |
|---|---|---|
| class | `{family.hf_class}`{quirks} | `LlamaForCausalLMEagle3` (SafeAILab layout: fc, midlayer.*, norm, lm_head, d2t, t2d) |
| layers | {r["num_hidden_layers"]} | 1 (+ fc over 3 aux layers) |
| hidden / intermediate | {r["hidden_size"]} / {r["intermediate_size"]} | {r["hidden_size"]} / {r["intermediate_size"]} |
| heads / KV heads / head_dim | {r["num_attention_heads"]} / {r["num_key_value_heads"]} / {r["head_dim"]} | same |
| vocabulary | {r["vocab_size"]} (byte-level BPE, Llama-3 special tokens + chat template) | {r["draft_vocab"]} most frequent target ids (d2t/t2d) |
| aux capture layers | outputs of layers {aux} (TensorRT-LLM default for {r["num_hidden_layers"]} layers) | |
| RoPE | theta {r["rope_theta"]:.0f}, max positions {r["max_position_embeddings"]} | same |
| parameters | {f["target"]["params"]:,} | {f["draft"]["params"]:,} |
| size on disk (bf16 safetensors + tokenizer/config) | {f["sizes"]["target_bytes"] / mb:.1f} MiB | {f["sizes"]["draft_bytes"] / mb:.1f} MiB |

## Corpus

The Python standard library's own source (`sysconfig.get_paths()["stdlib"]`, top-level `*.py` modules;
PSF License), CPython {f["python"]} when these weights were made. Fixed sorted file list in
`eagle3_trt/testing/tiny_recipe.py` (`CORPUS_FILES`); {len(f["corpus"]["train_files"])} training files
({f["corpus"]["train_chars"]:,} characters, {f["target"]["train_tokens_in_corpus"]:,} tokens).
Held out from both models: {", ".join(f["corpus"]["heldout_files"])}
({f["target"]["heldout_tokens"]:,} tokens). Missing on this Python: {", ".join(f["corpus"]["missing_files"]) or "none"}.
The draft's data: {f["corpus"]["draft_pieces"]} pieces of ~{r["draft_piece_chars"]} characters spread evenly over the training files;
with `--generate` the target continued the first {r["eval_prompt_len"]} tokens of each by {r["draft_gen_tokens"]} greedy tokens, so the
head learned the target's own output{raw_note}.

## Training budget

- Target: {r["target_steps"]} AdamW steps x {r["target_batch"]} random windows of {r["target_seq"]} tokens
  ({f["target"]["tokens_seen"]:,} tokens seen), peak lr {r["target_lr"]}, warmup + cosine, seed {r["seed"]}.
  Final train loss {f["target"]["final_train_loss"]}, held-out loss {f["target"]["heldout_loss"]} nats/token.
- Draft: `train-draft --generate` with {r["draft_steps"]} steps x {r["draft_batch"]} windows of {r["draft_seq"]} tokens,
  training-time test over {r["max_draft_len"]} draft steps, peak lr {r["draft_lr"]}, draft vocabulary {r["draft_vocab"]}
  (coverage {f["draft"]["draft_vocab_coverage"]:.1%} of training tokens), final loss {f["draft"]["final_loss"]}.
  Its own report (acceptance and teacher-forced accuracy on the held-out tenth of its data): `draft/train_report.json`.

## Run time

{t["total_s"] / 60:.1f} min in all on a shared 2-core CPU, {r["threads"]} torch thread: tokenizer {t["tokenizer_s"]} s,
target {t["target_s"]} s, draft {t["draft_s"]} s (target continuations, hidden states, training, evaluation),
held-out measurement {t["measure_s"]} s.
torch {f["torch"]}.

## Reproduce

    python -m eagle3_trt.testing.make_tiny_pair{"" if family.name == "llama" else " --family " + family.name} -o models/{f.get("name", "tiny")} --overwrite

Seeds, file list and step counts are fixed; another Python version's standard library differs
slightly, so the committed weights are the reference. All figures above are in `tiny_pair.json`.
"""
