"""The family table (convert/families.py) and Qwen3 through every stage: config-only presets and
their plans, validation of Qwen3's specifics, the reference runtime against transformers, ModelOpt
FP8 export, and the embedded tiny-qwen3 pair through build -> alpha -> Triton -> client."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open

from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.load import load_target
from eagle3_trt.convert.target import read_target
from eagle3_trt.convert.validate import validate_pair
from eagle3_trt.errors import UserError
from eagle3_trt.formats.families import FAMILIES, LLAMA, QWEN3
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.model_size import count_target, parse_shape, read_config
from eagle3_trt.pipeline.presets import load_preset

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "models" / "tiny-qwen3"
CONFIGS = ROOT / "build" / "model_configs"


def _edit(cfg_file: Path, **kw) -> None:
    cfg = json.loads(cfg_file.read_text())
    cfg.update(kw)
    cfg_file.write_text(json.dumps(cfg))


@pytest.fixture()
def qwen_pair(tmp_path) -> tuple[Path, Path]:
    """A private copy of the embedded tiny-qwen3 pair a test may break."""
    shutil.copytree(PAIR / "target", tmp_path / "target")
    shutil.copytree(PAIR / "draft", tmp_path / "draft")
    return tmp_path / "target", tmp_path / "draft"


# ---- the table ------------------------------------------------------------------------------------
def test_unknown_family_is_refused_by_name_listing_the_known_ones(qwen_pair):
    _edit(qwen_pair[0] / "config.json", model_type="falcon")
    with pytest.raises(UserError) as e:
        read_target(qwen_pair[0])
    line = e.value.line()
    assert "\n" not in line and "config.json:model_type" in line and "'falcon' is not a target family" in line
    for f in FAMILIES:
        assert f.name in line


def test_architecture_of_another_family_is_refused(qwen_pair):
    _edit(qwen_pair[0] / "config.json", architectures=["LlamaForCausalLM"])
    with pytest.raises(UserError, match=r"config\.json:architectures: 'LlamaForCausalLM' is not a qwen3 class"):
        read_target(qwen_pair[0])


def test_each_model_type_has_one_family_and_a_transformers_class():
    seen = [t for f in FAMILIES for t in f.model_types]
    assert len(seen) == len(set(seen))
    for f in FAMILIES:
        assert getattr(transformers, f.hf_class) and getattr(transformers, f.hf_config_class)


@pytest.mark.parametrize("fam", [LLAMA, QWEN3], ids=lambda f: f.name)
def test_head_dim_default_is_the_transformers_config_class_default(fam):
    """A config without head_dim: Qwen3Config defaults to 128 whatever hidden/heads, LlamaConfig to hidden/heads."""
    cfg = {"hidden_size": 64, "num_attention_heads": 4}
    want = getattr(transformers, fam.hf_config_class)(**cfg).head_dim
    assert fam.head_dim(cfg) == want == (128 if fam is QWEN3 else 16)


# ---- Qwen3 presets: config-only plans and dry runs ----------------------------------------------------
@pytest.mark.parametrize(
    "name, aux, layers, hidden, heads, inter", [("qwen3-8b", [1, 17, 32], 36, 4096, 32, 12288), ("qwen3-32b", [1, 31, 60], 64, 5120, 64, 25600)]
)
def test_qwen3_presets_plan_and_validate_from_config_files(name, aux, layers, hidden, heads, inter, tmp_path):
    res = build_bundle(EngineRequest(preset=load_preset(name), target_gpu="h100", dry_run=True, out=str(tmp_path / "b")))
    val = json.loads((res.bundle / "validation.json").read_text())
    assert val["aux_layer_ids"] == aux and val["aux_layers_are_default"]
    fam = next(c["detail"] for c in val["checks"] if c["check"] == "target_family")
    assert fam.startswith("qwen3 (Qwen3ForCausalLM;") and "per-head q/k RMSNorm" in fam and "rope theta 1e+06" in fam
    assert ("!= hidden 5120" in fam) == (name == "qwen3-32b")  # 64 heads x 128 = 8192
    # parameter count by hand: q/o 2 x hidden x heads*128, k/v 2 x hidden x 8*128, gate/up/down, and
    # per layer 2 RMSNorms of hidden + q/k norms of head_dim 128; untied embedding and lm_head
    per_layer = 2 * hidden * heads * 128 + 2 * hidden * 8 * 128 + 3 * hidden * inter + 2 * hidden + 2 * 128
    total = layers * per_layer + hidden + 2 * 151936 * hidden
    p = count_target(parse_shape(read_config(CONFIGS / name / "target" / "config.json")))
    assert p.total == total and round(total / 1e9, 1) == {"qwen3-8b": 8.2, "qwen3-32b": 32.8}[name]
    plan = res.manifest.plan
    assert plan["kv_bytes_per_token_target"] == 2 * layers * 8 * 128 * 1  # FP8 KV, TP1


# ---- validation of Qwen3's specifics on real files -------------------------------------------------
def test_validation_reports_the_family_and_refuses_its_traps(qwen_pair):
    t, d = qwen_pair
    rep = validate_pair(read_target(t), load_draft(d), 512)
    fam = rep.checks[0]["detail"]
    assert rep.checks[0]["check"] == "target_family"
    assert "head_dim 48 (heads x head_dim = 192 != hidden 128)" in fam and "lm_head tied to the embedding" in fam
    _edit(t / "config.json", use_sliding_window=True)
    with pytest.raises(UserError, match=r"config\.json:use_sliding_window: .*no sliding window"):
        validate_pair(read_target(t), load_draft(d), 512)
    _edit(t / "config.json", use_sliding_window=False, head_dim=32)
    with pytest.raises(UserError, match=r"q_proj\.weight: 192 output rows, config says .* 4 x 32 = 128"):
        validate_pair(read_target(t), load_draft(d), 512)


def test_validation_refuses_a_qwen3_checkpoint_without_q_norm(qwen_pair, tmp_path):
    from safetensors.torch import load_file, save_file

    t, d = qwen_pair
    sd = load_file(str(t / "model.safetensors"))
    del sd["model.layers.7.self_attn.q_norm.weight"]
    save_file(sd, str(t / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"model\.layers\.7\.self_attn\.q_norm\.weight missing: a qwen3 decoder layer has it"):
        validate_pair(read_target(t), load_draft(d), 512)


# ---- the reference runtime computes what transformers computes, aux capture included -------------
def test_runtime_target_matches_transformers_qwen3():
    ids = load_draft(PAIR / "draft").config.aux_layer_ids
    tm = load_target(PAIR / "target", dtype=torch.float32, aux_layer_ids=ids)
    assert type(tm.hf).__name__ == "Qwen3ForCausalLM" and tm.family is QWEN3
    hf = transformers.Qwen3ForCausalLM.from_pretrained(PAIR / "target", torch_dtype=torch.float32).eval()
    x = torch.tensor([[5, 17, 300, 42, 99, 7, 512, 3]])
    with torch.no_grad():
        ref = hf(input_ids=x, output_hidden_states=True)
    S = x.shape[1]
    allowed = torch.tril(torch.ones(S, S, dtype=torch.bool))[None]
    logits, aux = tm.forward(x, torch.arange(S)[None], allowed)
    torch.testing.assert_close(logits, ref.logits, rtol=1e-4, atol=1e-4)
    # TensorRT-LLM's capture id i = output of decoder layer i = transformers' hidden_states[i + 1]
    torch.testing.assert_close(aux, torch.cat([ref.hidden_states[i + 1] for i in ids], -1), rtol=1e-4, atol=1e-4)


# ---- build -> alpha -> Triton -> client on the embedded tiny-qwen3 pair ---------------------------
@pytest.fixture(scope="module")
def qwen_fp8_bundle(tmp_path_factory) -> Path:
    return build_bundle(
        EngineRequest(preset=load_preset("tiny-qwen3"), target_gpu="h100", calib_samples=4, out=str(tmp_path_factory.mktemp("q3") / "fp8"))
    ).bundle


def test_fp8_export_keeps_qk_norms_and_lm_head_bf16(qwen_fp8_bundle):
    with safe_open(str(qwen_fp8_bundle / "target" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        dt = {k: str(f.get_slice(k).get_dtype()) for k in keys}
    assert dt["model.layers.3.self_attn.q_proj.weight"] == "F8_E4M3"
    assert dt["model.layers.3.self_attn.q_norm.weight"] == dt["model.layers.3.self_attn.k_norm.weight"] == "BF16"
    assert dt["model.embed_tokens.weight"] == "BF16" and not any("norm" in k and "scale" in k for k in keys)
    assert "lm_head.weight" not in keys  # tied: TensorRT-LLM takes the embedding (tie_word_embeddings)
    cfg = json.loads((qwen_fp8_bundle / "target" / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True and cfg["model_type"] == "qwen3"


def test_alpha_on_the_qwen3_bundle(qwen_fp8_bundle, tmp_path, alpha_on_heldout):
    o = alpha_on_heldout(qwen_fp8_bundle, PAIR, tmp_path)["pairs"]["bundle"]["overall"]
    assert o["requests"] == 3 and o["acceptance_length"] > 1.5, o


def _have_tritonserver() -> bool:
    import importlib.util

    return bool(shutil.which("tritonserver") or importlib.util.find_spec("pytriton"))


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3_trt.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.triton
@pytest.mark.needs("tritonserver")
def test_qwen3_bundle_served_by_triton_matches_the_runtime(qwen_fp8_bundle, tmp_path):
    """No per-family code outside the model core: the same package/serve/client path as the Llama bundle."""
    from eagle3_trt.clients.chat import PromptFormatter
    from eagle3_trt.clients.llm_client import GenerationParams, LLMClient
    from eagle3_trt.core.engine import SamplingParams
    from eagle3_trt.runtime.loader import engine_from_bundle
    from eagle3_trt.testing.servers import serve_triton

    repo, state = tmp_path / "repo", tmp_path / "state"
    r = _cli("package", str(qwen_fp8_bundle), "-o", str(repo))
    assert r.returncode == 0, r.stderr
    handle, _ = serve_triton(repo, state, "--timeout", "240")
    try:
        text = PromptFormatter(qwen_fp8_bundle)("def parse(line):")
        eng = engine_from_bundle(qwen_fp8_bundle, device="cpu")
        ids = eng.tokenizer.encode(text, add_special_tokens=not text.startswith(eng.tokenizer.bos_token))
        toks, stats = [], None
        for step in eng.stream(ids, SamplingParams(max_tokens=16), speculate=True):
            toks += step.new_token_ids
            stats = step.stats
        want = eng.tokenizer.decode(toks, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        with LLMClient(handle.grpc_url, http=False, timeout_s=120) as c:
            res = c.generate(text, GenerationParams(max_tokens=16))
        assert (res.text, res.n_tokens) == (want, len(toks))
        assert res.perf["total_draft_tokens"] == stats.draft_tokens > 0
        assert res.perf["total_accepted_draft_tokens"] == stats.accepted_tokens > 0
    finally:
        r = _cli("stop", "--state-dir", str(state))
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.needs("dynamo", "openai")
def test_qwen3_bundle_served_by_dynamo_matches_the_runtime(qwen_fp8_bundle, tmp_path):
    """The same Dynamo backend as the Llama bundle (dynamo_serving/ has no per-family code): the real
    OpenAI frontend and one worker, a chat request through the `openai` client, greedy text equal to the
    reference runtime called directly on the token ids the frontend sends (the tokenizer's chat template)."""
    import openai  # the [dynamo] extra; the test needs("dynamo", "openai")

    from eagle3_trt.runtime.llm_api import SamplingParams
    from eagle3_trt.runtime.reference_llm import ReferenceLLM
    from eagle3_trt.testing.servers import dynamo_served

    with dynamo_served(qwen_fp8_bundle, tmp_path / "dyn", workers=1) as (dep, _):
        llm = ReferenceLLM(qwen_fp8_bundle, device="cpu", torch_threads=1)
        q = "def parse(line):"
        ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False)
        want = llm.generate_async(list(ids), SamplingParams(max_tokens=16, temperature=0.0)).result(timeout=60).outputs[0].text
        llm.shutdown()
        client = openai.OpenAI(base_url=dep.url, api_key="unused", timeout=60, max_retries=0)
        res = client.chat.completions.create(
            model="eagle3", messages=[{"role": "user", "content": q}], max_tokens=16, temperature=0, extra_body={"nvext": {"extra_fields": ["engine_data"]}}
        )
        assert res.choices[0].message.content == want and want
        st = res.model_extra["nvext"]["engine_data"]["eagle3"]
        assert st["speculative"] and st["draft_tokens"] > 0 and st["completion_tokens"] == res.usage.completion_tokens
