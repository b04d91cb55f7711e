"""A random tiny EAGLE-3 pair made from a fixed seed: a Llama-architecture target and a matching head.

Ordinary Hugging Face directories, so every stage (validate, quantize, export, bundle, serve,
measure) runs on real files with no downloads. Tests use it because it is small and can be
broken at will; its acceptance is near zero (random weights). The `tiny` preset uses the trained
pair shipped in models/tiny/ (testing/make_tiny_pair.py), never this one.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_trt.atomic import make_dirs, write_json
from eagle3_trt.convert.prompts import SHIPPED_PROMPTS, load_prompt_records
from eagle3_trt.resources import data_dir

DATA_DIR = data_dir("convert") / "data"
TOKENIZER_DIR = DATA_DIR / "tiny_tokenizer"

# Llama-3 special tokens, so that chat templates and stop tokens behave as on the real models.
SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|finetune_right_pad_id|>",
]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@dataclass(frozen=True)
class TinyShape:
    vocab_size: int = 512
    hidden_size: int = 64
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 192
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    draft_vocab_size: int = 256
    draft_intermediate_size: int = 192


def corpus_texts() -> list[str]:
    """Text the tiny tokenizer is trained on: the shipped calibration prompts."""
    return [t for rec in load_prompt_records(SHIPPED_PROMPTS) for t in rec.turns]


def train_tokenizer(texts: list[str], vocab_size: int = 512):
    """Byte-level BPE with Llama-3 special tokens; deterministic for a given corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # only to regenerate the tiny pair

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def write_tokenizer(out: Path, texts: list[str] | None = None, vocab_size: int = 512) -> None:
    """tokenizer.json + tokenizer_config.json (Llama-3 specials and chat template) trained on texts
    (default: the shipped calibration prompts, which regenerates the committed copy)."""
    make_dirs(out)
    train_tokenizer(texts if texts is not None else corpus_texts() * 4, vocab_size).save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "pad_token": "<|finetune_right_pad_id|>",
        "model_max_length": 1024,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    write_json(out / "tokenizer_config.json", cfg)


def copy_tokenizer(out: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(TOKENIZER_DIR / name, out / name)


def token_frequencies(vocab_size: int) -> list[int]:
    """Counts of each target token id over the corpus (chat-formatted), for the draft vocabulary."""
    from tokenizers import Tokenizer  # only to regenerate the tiny pair

    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    counts = [0] * vocab_size
    for text in corpus_texts():
        for i in tok.encode(text).ids:
            counts[i] += 1
    return counts


def draft_vocab(vocab_size: int, draft_vocab_size: int, special_ids: list[int]) -> list[int]:
    """Target ids kept in the draft vocabulary: specials first, then by corpus frequency, sorted by id."""
    counts = token_frequencies(vocab_size)
    ranked = sorted(range(vocab_size), key=lambda i: (-counts[i], i))
    keep = list(dict.fromkeys(special_ids + ranked))[:draft_vocab_size]
    return sorted(keep)


def make_target(out: Path, shape: TinyShape = TinyShape(), seed: int = 0) -> None:
    import torch  # ~2 s; the shapes and configs of this module are read without it
    from transformers import LlamaConfig, LlamaForCausalLM  # ~3 s; only to regenerate the tiny pair

    make_dirs(out)
    copy_tokenizer(out)
    ids = _special_ids()
    # The names config.json carries under transformers 4.x and 5.x alike (rope_theta, torch_dtype):
    # 5.x's typed signature names their successors but still accepts these, so pass them as data.
    fields: dict[str, Any] = dict(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.hidden_size // shape.num_attention_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rope_theta=shape.rope_theta,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=ids["<|begin_of_text|>"],
        eos_token_id=[ids["<|end_of_text|>"], ids["<|eot_id|>"]],
        pad_token_id=ids["<|finetune_right_pad_id|>"],
        architectures=["LlamaForCausalLM"],
        torch_dtype="bfloat16",
    )
    cfg = LlamaConfig(**fields)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).bfloat16()
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)


def draft_tensors(shape: TinyShape = TinyShape(), seed: int = 1) -> dict:
    """SafeAILab-layout tensors of a random EAGLE-3 head for a target of `shape`."""
    import torch  # ~2 s; the shapes and configs of this module are read without it

    g = torch.Generator().manual_seed(seed)
    H, I = shape.hidden_size, shape.draft_intermediate_size
    hd = H // shape.num_attention_heads
    q_out, kv_out = shape.num_attention_heads * hd, shape.num_key_value_heads * hd

    def w(o: int, i: int):
        return (torch.randn(o, i, generator=g) * 0.02).to(torch.bfloat16)

    ids = draft_vocab(shape.vocab_size, shape.draft_vocab_size, list(_special_ids().values()))
    target_ids = torch.tensor(ids, dtype=torch.int64)
    t2d = torch.zeros(shape.vocab_size, dtype=torch.bool)
    t2d[target_ids] = True
    ones = torch.ones(H, dtype=torch.bfloat16)
    return {
        "fc.weight": w(H, 3 * H),
        "midlayer.hidden_norm.weight": ones.clone(),
        "midlayer.input_layernorm.weight": ones.clone(),
        "midlayer.post_attention_layernorm.weight": ones.clone(),
        "midlayer.self_attn.q_proj.weight": w(q_out, 2 * H),
        "midlayer.self_attn.k_proj.weight": w(kv_out, 2 * H),
        "midlayer.self_attn.v_proj.weight": w(kv_out, 2 * H),
        "midlayer.self_attn.o_proj.weight": w(H, q_out),
        "midlayer.mlp.gate_proj.weight": w(I, H),
        "midlayer.mlp.up_proj.weight": w(I, H),
        "midlayer.mlp.down_proj.weight": w(H, I),
        "norm.weight": ones.clone(),
        "lm_head.weight": w(shape.draft_vocab_size, H),
        "d2t": target_ids - torch.arange(shape.draft_vocab_size, dtype=torch.int64),
        "t2d": t2d,
    }


def draft_config(shape: TinyShape = TinyShape()) -> dict:
    """config.json of a SafeAILab-format EAGLE-3 head (the layout TensorRT-LLM loads natively)."""
    ids = _special_ids()
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.draft_intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.hidden_size // shape.num_attention_heads,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_theta": shape.rope_theta,
        "rms_norm_eps": 1e-5,
        "vocab_size": shape.vocab_size,
        "draft_vocab_size": shape.draft_vocab_size,
        "target_hidden_size": shape.hidden_size,
        "bos_token_id": ids["<|begin_of_text|>"],
        "eos_token_id": ids["<|eot_id|>"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def make_draft(out: Path, shape: TinyShape = TinyShape(), seed: int = 1) -> None:
    from safetensors.torch import save_file  # imports torch (~2 s); see draft_tensors

    make_dirs(out)
    save_file(draft_tensors(shape, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    write_json(out / "config.json", draft_config(shape))


def make_pair(out: Path, shape: TinyShape = TinyShape(), seed: int = 0) -> tuple[Path, Path]:
    """Write <out>/target and <out>/draft; returns both paths."""
    target, draft = Path(out) / "target", Path(out) / "draft"
    make_target(target, shape, seed)
    make_draft(draft, shape, seed + 1)
    return target, draft


def _special_ids() -> dict[str, int]:
    vocab = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text())["added_tokens"]
    return {t["content"]: t["id"] for t in vocab}


if __name__ == "__main__":  # regenerate the committed tokenizer
    write_tokenizer(TOKENIZER_DIR)
    print(f"wrote {TOKENIZER_DIR}")
