"""Heads other tools write, made with their own code, served as their producers trained them.

speculators 0.9.0 (``Eagle3DraftModel`` + ``save_pretrained``, ``Eagle3Converter``) and SpecForge 0.2.0
(``LlamaForCausalLMEagle3`` + ``save_pretrained``) make tiny heads: unsorted aux ids, their default
training flags, a sliding window, Qwen3-style layers, two layers, reduced and full vocabularies, the
converter's output. For each, either the toolkit's draft (core/draft.py, loaded by load_draft) computes
the producer's own forward (step 1 over a context and step 2 from the fed-back hidden state: top-1
identical, max abs difference <= 1e-4), or validate refuses it in one line naming the field and the
producer. What each producer trained and what TensorRT-LLM serves is formats/draft_producers.py.
Installed by the Makefile (--no-deps) in .venv and .venv-compat.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from eagle3_trt.cli import main
from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.formats.draft_config import trtllm_config
from eagle3_trt.testing.peer_layer_config import speculators_layer_config
from eagle3_trt.testing.tiny_pair import make_pair

S = 9  # context positions compared
H, V, D = 64, 512, 256  # the tiny target's hidden size and vocabulary; a reduced draft vocabulary


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    return make_pair(tmp_path_factory.mktemp("peer") / "pair")


def _target_embed(target: Path) -> torch.Tensor:
    return load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"].float()


def _randomise_norms(model: torch.nn.Module, seed: int) -> None:
    """Norms away from ones, so pre- and post-norm paths (and a dropped norm) differ visibly."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))


def _vocab_maps(draft_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """t2d/d2t for a reduced vocabulary: every other target id (not the identity, so d2t matters)."""
    ids = torch.arange(0, 2 * draft_vocab, 2)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    return t2d, ids - torch.arange(draft_vocab)


# ---------------------------------------------------------------------------------------------
# speculators 0.9.0
# ---------------------------------------------------------------------------------------------
def speculators_head(out: Path, target: Path, *, layers=1, draft_vocab=D, aux=(2, 4, 6), window=None, arch="llama", seed=0, target_embed=True, **flags) -> Path:
    """A head made and saved with speculators' own classes, as its trainer builds one (from_training_args
    minus reading data): the verifier's embedding copied in (``target_embed`` False: speculators' own
    initialisation kept, as a head trained with its embedding unfrozen ships another), random weights."""
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import Qwen3Config

    cls = {"llama": LlamaConfig, "qwen3": Qwen3Config}[arch]
    extra = {"sliding_window": window, "layer_types": ["sliding_attention"] * layers} if window else {}
    layer = speculators_layer_config(cls, V, H, layers, **extra)
    torch.manual_seed(seed)
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=draft_vocab,
        eagle_aux_hidden_state_layer_ids=list(aux) if aux is not None else None,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(target), architectures=["LlamaForCausalLM"]),
        ),
        **flags,
    )
    m = Eagle3DraftModel(cfg)
    with torch.no_grad():
        if target_embed:
            m.embed_tokens.weight.copy_(_target_embed(target))
        m.lm_head.weight.copy_(torch.randn(draft_vocab, H) * 0.1)  # speculators initialises it to NaN
    if draft_vocab != V:
        m.load_vocab_mappings(*_vocab_maps(draft_vocab))
    _randomise_norms(m, seed)
    m.save_pretrained(out)
    return out


def speculators_logits(head: Path, ids: torch.Tensor, aux: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """speculators' own training forward (two TTT steps), its lm_head's outputs taken by a hook:
    (step-1 logits [S, D], step-2 logits [S, D]); step 2 at position j reads ids[j+1]."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    cfg = Eagle3SpeculatorConfig.from_pretrained(str(head))
    cfg.transformer_layer_config._attn_implementation = "eager"  # speculators' dense-mask path (flex attention: its GPU default)
    m = Eagle3DraftModel.from_pretrained(str(head), config=cfg).float().eval()
    seen: list[torch.Tensor] = []
    m.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(out.detach()[0]))
    with torch.no_grad():
        m(
            hidden_states=aux[None],
            input_ids=ids[None],
            document_ids=torch.zeros(1, len(ids), dtype=torch.long),
            position_ids=torch.arange(len(ids))[None],
            ttt_steps=2,
        )
    return seen[0], seen[1]


# ---------------------------------------------------------------------------------------------
# SpecForge 0.2.0
# ---------------------------------------------------------------------------------------------
def specforge_head(out: Path, target: Path, *, draft_vocab=D, seed=0, **flags) -> tuple[Path, torch.nn.Module]:
    """(the saved head, the model that was saved). SpecForge 0.2 pins transformers 5.8.1: under this
    environment's transformers, its from_pretrained leaves the rotary tables (non-persistent buffers) as
    uninitialised memory, so its forward is run on the instance it saved."""
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3

    cfg = LlamaConfig(
        architectures=["LlamaForCausalLMEagle3"],
        vocab_size=V,
        draft_vocab_size=draft_vocab,
        hidden_size=H,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=0,  # SpecForge's draft configs carry the target's ids (configs/*-eagle3.json)
        eos_token_id=4,
        **flags,
    )
    torch.manual_seed(seed)
    m = LlamaForCausalLMEagle3(cfg, attention_backend="sdpa")
    with torch.no_grad():
        m.embed_tokens.weight.copy_(_target_embed(target))
        if draft_vocab != V:
            t2d, d2t = _vocab_maps(draft_vocab)
            m.t2d.copy_(t2d)
            m.d2t.copy_(d2t)
    _randomise_norms(m, seed)
    m.save_pretrained(out)
    return out, m.eval()


def specforge_logits(m: torch.nn.Module, ids: torch.Tensor, aux: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SpecForge's TTT steps as algorithms/eagle3/model.py runs them (project_hidden_states, backbone with
    cache_hidden, the backbone's output fed back, compute_logits)."""
    n = len(ids)
    pos = torch.arange(n)[None]
    with torch.no_grad():
        mask = m.prepare_decoder_attention_mask(torch.ones(1, n, dtype=torch.bool), aux[None], 1, n, 0)
        cache: list[list[torch.Tensor]] = [[], []]
        h = m.project_hidden_states(aux[None])
        out = []
        for step in range(2):
            step_ids = torch.cat([ids[step:], ids.new_zeros(step)])
            h = m.backbone(input_embeds=m.embed_input_ids(step_ids[None]), hidden_states=h, cache_hidden=cache, attention_mask=mask, position_ids=pos)
            out.append(m.compute_logits(h)[0])
    return out[0], out[1]


# ---------------------------------------------------------------------------------------------
# the toolkit's draft on the same inputs
# ---------------------------------------------------------------------------------------------
def toolkit_logits(head: Path, target: Path, ids: torch.Tensor, aux: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1 over the context from the target's aux states; step 2 at each position j from the fed-back
    hidden state with the draft KV of positions <= j, as TensorRT-LLM's next draft pass runs it."""
    d = Eagle3Draft.from_checkpoint(load_draft(head), dtype=torch.float32)
    E = _target_embed(target)  # TensorRT-LLM shares the target's embedding (hidden sizes equal)
    n = len(ids)
    with torch.no_grad():
        h1, l1, (k, v) = d(E[ids][None], None, torch.arange(n)[None], aux=aux[None])
        l2 = []
        for j in range(n - 1):
            _, lj, _ = d(E[ids[j + 1]][None, None], h1[:, j : j + 1], torch.tensor([[j + 1]]), past=(k[:, :, : j + 1], v[:, :, : j + 1]))
            l2.append(lj[0, 0])
    assert l1 is not None
    return l1[0], torch.stack(l2)


def inputs(seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(6, V, (S,), generator=g), torch.randn(S, 3 * H, generator=g)


def assert_same_function(mine: tuple[torch.Tensor, torch.Tensor], theirs: tuple[torch.Tensor, torch.Tensor]) -> None:
    (m1, m2), (t1, t2) = mine, theirs
    t2 = t2[: len(m2)]  # the producer's last step-2 position reads a padding token
    for a, b in ((m1, t1), (m2, t2)):
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        assert (a - b).abs().max().item() <= 1e-4


def validate(target: Path, head: Path, capsys, *extra: str) -> tuple[int, str, str]:
    capsys.readouterr()  # the producers' own save_pretrained progress bars
    rc = main(["validate", "--target", str(target), "--draft", str(head), *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_refused(rc: int, err: str, field: str, producer: str) -> None:
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert field in err and producer in err, err


# ---------------------------------------------------------------------------------------------
# speculators heads
# ---------------------------------------------------------------------------------------------
SERVED = {
    # unsorted aux ids (vLLM ids: inputs of layers 6, 2, 4), norm_before_fc + norm_output, reduced vocab
    "unsorted aux ids, norm_before_fc, norm_output": dict(aux=(6, 2, 4), norm_before_fc=True, norm_output=True),
    # fc_norm, pre-norm feedback, full vocabulary
    "fc_norm, full vocabulary": dict(fc_norm=True, draft_vocab=V),
    # --num-layers 2 (later layers are plain decoder layers; TensorRT-LLM's regular midlayer.1)
    "two layers": dict(layers=2, norm_before_fc=True, norm_output=True),
    # the default 2048-token window: the same function within it
    "sliding window 2048": dict(window=2048, norm_before_fc=True, norm_output=True),
}


@pytest.mark.parametrize("name", SERVED)
def test_speculators_head_is_served_as_trained(pair, tmp_path, capsys, name):
    target, _ = pair
    head = speculators_head(tmp_path / "head", target, **SERVED[name])
    rc, out, err = validate(target, head, capsys, "--max-seq-len", "512")
    assert rc == 0, err
    ids, aux = inputs()
    assert_same_function(toolkit_logits(head, target, ids, aux), speculators_logits(head, ids, aux))


def test_speculators_unsorted_aux_ids_are_not_permuted(pair, tmp_path):
    """fc's blocks follow ascending layer order for every producer: the same head listed [6, 2, 4] and
    [2, 4, 6] is one function (it used to be permuted for the unsorted list: AL 1.92 instead of 2.35)."""
    target, _ = pair
    ids, aux = inputs()
    a = toolkit_logits(speculators_head(tmp_path / "a", target, aux=(6, 2, 4)), target, ids, aux)
    b = toolkit_logits(speculators_head(tmp_path / "b", target, aux=(2, 4, 6)), target, ids, aux)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert load_draft(tmp_path / "a").config.aux_layer_ids == (1, 3, 5)


def test_speculators_training_defaults_are_refused(pair, tmp_path, capsys):
    """speculators' train defaults: norm_before_residual, norm_before_fc, norm_output, a 2048-token window.
    TensorRT-LLM adds the un-normed hidden as the residual, so the head is refused (it used to be built with
    a warning, agreeing with the trained function on 21% of top-1 tokens)."""
    target, _ = pair
    head = speculators_head(tmp_path / "head", target, window=2048, norm_before_residual=True, norm_before_fc=True, norm_output=True)
    rc, _, err = validate(target, head, capsys)
    assert_refused(rc, err, "config.json:norm_before_residual", "speculators")
    # and the function really differs: served without norm_before_residual, top-1 would disagree
    ids, aux = inputs()
    theirs = speculators_logits(head, ids, aux)
    c = json.loads((head / "config.json").read_text())
    c["norm_before_residual"] = False
    (head / "config.json").write_text(json.dumps(c))
    mine = toolkit_logits(head, target, ids, aux)
    assert (mine[1] - theirs[1][: S - 1]).abs().max().item() > 1e-2


def test_speculators_window_shorter_than_max_seq_len_is_refused(pair, tmp_path, capsys):
    target, _ = pair
    head = speculators_head(tmp_path / "head", target, window=64)
    rc, _, err = validate(target, head, capsys, "--max-seq-len", "512")
    assert_refused(rc, err, "config.json:transformer_layer_config.sliding_window", "speculators")
    rc, out, err = validate(target, head, capsys, "--max-seq-len", "64")
    assert rc == 0 and "64-token sliding window" in out, err
    # a dry run refuses it the same way (config-only checks)
    rc = main(["engine", "--target", str(target), "--draft", str(head), "--target-gpu", "h100", "--dry-run", "--max-seq-len", "512", "-o", str(tmp_path / "b")])
    _, err = capsys.readouterr()
    assert_refused(rc, err, "config.json:transformer_layer_config.sliding_window", "speculators")


def test_speculators_one_aux_layer_is_refused(pair, tmp_path, capsys):
    """speculators allows one target layer and always applies fc; TensorRT-LLM's apply_eagle3_fc skips fc
    when the aux width equals hidden_size, so the head would be served without it (it used to build with a
    warning, agreeing with its trained function on 16% of step-1 tokens)."""
    target, _ = pair
    head = speculators_head(tmp_path / "head", target, aux=(5,))
    rc, _, err = validate(target, head, capsys, "--max-seq-len", "512")
    assert_refused(rc, err, "fc.weight", "TensorRT-LLM would skip fc")
    # and it is another function: the toolkit's draft (TensorRT-LLM's rule) against speculators' forward
    ids, aux = inputs()
    one = aux[:, :H]  # one target layer's hidden state
    theirs = speculators_logits(head, ids, one)
    d = Eagle3Draft.from_checkpoint(load_draft(head), dtype=torch.float32)
    with torch.no_grad():
        _, mine, _ = d(_target_embed(target)[ids][None], None, torch.arange(S)[None], aux=one[None])
    assert (mine[0] - theirs[0]).abs().max().item() > 1e-2


def test_config_with_fewer_layers_than_the_tensors_is_refused(pair, tmp_path, capsys):
    """A two-layer speculators head whose config says one layer: TensorRT-LLM builds one and drops layer 1's
    tensors (it used to build with a warning, 58.6% agreement with the head its tensors form)."""
    target, _ = pair
    head = speculators_head(tmp_path / "head", target, layers=2, norm_before_fc=True, norm_output=True)
    c = json.loads((head / "config.json").read_text())
    c["transformer_layer_config"]["num_hidden_layers"] = 1
    (head / "config.json").write_text(json.dumps(c))
    rc, _, err = validate(target, head, capsys, "--max-seq-len", "512")
    assert_refused(rc, err, "config.json:transformer_layer_config.num_hidden_layers", "would build 1 and drop")
    assert "holds 2 (layers [0, 1])" in err


def test_shipped_embedding_other_than_the_targets_is_refused(pair, tmp_path, capsys):
    """A speculators head that ships an embedding other than the target's: TensorRT-LLM serves it with the
    target's (hidden sizes equal), another function (57% agreement); the same head with the target's
    embedding is served, with one line saying the equal table is not shipped."""
    target, _ = pair
    head = speculators_head(tmp_path / "head", target, target_embed=False)
    rc, _, err = validate(target, head, capsys, "--max-seq-len", "512")
    assert_refused(rc, err, ":embed_tokens.weight", "the target's model.embed_tokens.weight")
    assert f"of {V} rows" in err
    same = speculators_head(tmp_path / "same", target)
    rc, out, err = validate(target, same, capsys, "--max-seq-len", "512")
    assert rc == 0 and "(equal to the target's) is not shipped" in out, err


def test_out_of_range_aux_id_is_quoted_as_the_file_writes_it(pair, tmp_path, capsys):
    """speculators numbers aux layers as vLLM does (inputs of layers): 9 on the 8-layer target is out of
    range, 8 is not; the line quotes 9, with TensorRT-LLM's 8 beside it."""
    target, _ = pair
    head = speculators_head(tmp_path / "head", target, aux=(2, 4, 9))
    rc, _, err = validate(target, head, capsys, "--max-seq-len", "512")
    assert_refused(rc, err, "config.json:eagle_aux_hidden_state_layer_ids", "aux layer ids [9] (TensorRT-LLM's layer outputs [8]")
    assert "ids 1..8 in this file's numbering" in err
    ok = speculators_head(tmp_path / "ok", target, aux=(2, 4, 8))
    rc, _, err = validate(target, ok, capsys, "--max-seq-len", "512")
    assert rc == 0, err


def test_speculators_qwen3_layers_are_refused(pair, tmp_path, capsys):
    target, _ = pair
    head = speculators_head(tmp_path / "head", target, arch="qwen3")
    rc, _, err = validate(target, head, capsys)
    assert_refused(rc, err, "config.json:transformer_layer_config.model_type", "speculators")


def test_speculators_converter_output(pair, tmp_path, capsys):
    """speculators' Eagle3Converter on the tiny SafeAILab head: aux ids written as null. vLLM and TensorRT-LLM
    then use the target's default layers (the same ones); the toolkit does too, and says so once."""
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    target, draft = pair
    out = tmp_path / "converted"
    Eagle3Converter().convert(draft, out, base_model=str(target), validate=False)
    raw = json.loads((out / "config.json").read_text())
    assert raw["eagle_aux_hidden_state_layer_ids"] is None
    rc, text, err = validate(target, out, capsys, "--max-seq-len", "512")
    assert rc == 0, err
    assert text.count("eagle_aux_hidden_state_layer_ids is null") == 1 and "[1, 3, 4]" in text
    ids, aux = inputs()
    mine = toolkit_logits(out, target, ids, aux)
    ref = toolkit_logits(draft, target, ids, aux)  # the head before conversion: the same function
    assert torch.equal(mine[0], ref[0]) and torch.equal(mine[1], ref[1])
    # told norm_before_fc, the converter writes the flag but no input_norm tensor: refused, not served without it
    out2 = tmp_path / "converted-nbf"
    Eagle3Converter().convert(draft, out2, base_model=str(target), validate=False, norm_before_fc=True, eagle_aux_hidden_state_layer_ids=[2, 4, 5])
    rc, _, err = validate(target, out2, capsys, "--max-seq-len", "512")
    assert rc == 2 and "tensor input_norm.weight missing" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("method", ["peagle", "dflash"])
def test_other_speculators_methods_are_refused_by_name(pair, tmp_path, capsys, method):
    from speculators.models.dflash import DFlashSpeculatorConfig
    from speculators.models.peagle import PEagleSpeculatorConfig

    target, _ = pair
    cfg = (PEagleSpeculatorConfig if method == "peagle" else DFlashSpeculatorConfig)()
    head = tmp_path / "head"
    cfg.save_pretrained(head)
    rc, _, err = validate(target, head, capsys)
    if method == "peagle":  # read by its own home (speculative/peagle): a default config has no mask token
        assert_refused(rc, err, "config.json:mask_token_id", "parallel drafting")
    else:
        assert_refused(rc, err, "config.json:speculators_model_type", "DFlash")


def test_speculators_head_bundle(pair, tmp_path, capsys):
    """The bundle ships what TensorRT-LLM loads and nothing else (no embed_tokens shared with the target, no
    t2d), the flags where TensorRT-LLM reads them, the target's bos/eos (0 and [1, 4], not speculators'
    nested 1 and 2), and each warning is printed once."""
    target, _ = pair
    head = speculators_head(tmp_path / "head", target, aux=(6, 2, 4), window=2048, norm_before_fc=True, norm_output=True)
    b = tmp_path / "b"
    capsys.readouterr()
    rc = main(["engine", "--target", str(target), "--draft", str(head), "--target-gpu", "h100", "--quant", "bf16", "--skip-behaviour-checks", "-o", str(b)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    text = out + err
    for line in {ln.strip() for ln in text.splitlines() if "warning" in ln.lower()}:
        assert text.count(line) == 1, line
    cfg = json.loads((b / "draft" / "config.json").read_text())
    assert cfg["bos_token_id"] == 0 and cfg["eos_token_id"] == [1, 4]
    assert "norm_output" not in cfg and cfg["eagle_config"]["return_hidden_post_norm"] is True and cfg["eagle_config"]["norm_before_fc"] is True
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    names = set(load_file(str(b / "draft" / "model.safetensors")))
    assert "embed_tokens.weight" not in names and "t2d" not in names and {"d2t", "input_norm.weight", "midlayer.hidden_norm.weight"} <= names


# ---------------------------------------------------------------------------------------------
# SpecForge heads
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags", [{}, {"norm_output": True, "fc_norm": True}, {"draft_vocab": V}], ids=["defaults", "eagle3.1 config", "full vocabulary"])
def test_specforge_head_is_served_as_trained(pair, tmp_path, capsys, flags):
    """SpecForge's norm_output (default true) applies the final norm before lm_head and feeds the pre-norm
    hidden state back; it used to be read as post-norm feedback (AL 1.62 instead of 1.94)."""
    target, _ = pair
    head, model = specforge_head(tmp_path / "head", target, **flags)
    rc, _, err = validate(target, head, capsys, "--max-seq-len", "512")
    assert rc == 0, err
    ids, aux = inputs()
    theirs = specforge_logits(model, ids, aux)
    assert_same_function(toolkit_logits(head, target, ids, aux), theirs)
    assert "norm_output" not in trtllm_config(load_draft(head).config, {})  # TensorRT-LLM would read it as post-norm feedback
    # and that reading is another function: post-norm feedback changes step 2
    c = json.loads((head / "config.json").read_text())
    c.pop("norm_output", None)
    c["eagle_config"] = {"return_hidden_post_norm": True}
    (head / "config.json").write_text(json.dumps(c))
    assert (toolkit_logits(head, target, ids, aux)[1] - theirs[1][: S - 1]).abs().max().item() > 1e-2


def test_specforge_norm_output_false_is_refused(pair, tmp_path, capsys):
    target, _ = pair
    head, _ = specforge_head(tmp_path / "head", target, norm_output=False)
    rc, _, err = validate(target, head, capsys)
    assert_refused(rc, err, "config.json:norm_output", "SpecForge")


def test_specforge_other_method_is_refused_by_name(pair, tmp_path, capsys):
    target, draft = pair
    head = tmp_path / "head"
    head.mkdir()
    cfg = json.loads((draft / "config.json").read_text())
    cfg["architectures"] = ["PEagleDraftModel"]  # what SpecForge's PEagleDraftModel writes (config.architectures = [its name])
    (head / "config.json").write_text(json.dumps(cfg))
    save_file(load_file(str(draft / "model.safetensors")), str(head / "model.safetensors"))
    rc, _, err = validate(target, head, capsys)
    assert_refused(rc, err, "config.json:architectures", "P-EAGLE")


def test_two_layer_head_decodes_exactly_through_the_engine(pair, tmp_path):
    """A multi-layer head through the reference runtime (its layers' KV caches travel as one pair):
    greedy speculative output equals the target's own, with drafts proposed."""
    from eagle3_trt.convert.load import load_engine
    from eagle3_trt.core.engine import SamplingParams

    target, _ = pair
    head = speculators_head(tmp_path / "head", target, layers=2, norm_before_fc=True, norm_output=True)
    eng = load_engine(target, head, dtype=torch.float32, max_draft_len=3)
    prompt = [[0, 17, 42, 99, 7, 3, 250]]
    p = SamplingParams(max_tokens=12)
    res = eng.generate(prompt, p)[0]
    assert res.token_ids == eng.generate(prompt, p, speculate=False)[0].token_ids
    assert res.stats.draft_tokens > 0
