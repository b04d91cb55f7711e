"""The bad-input corpus: every input the toolkit refuses, run through the real command line.

One row per case: how the input is made (a mutated copy of the tiny pair, a bad prompt file, a
bad option), the command, the expected exit code and a pattern for the one-line message, which
names the file or field at fault. Every case also checks that nothing is left behind (no bundle,
no staging directory, no lock file, no report: the case's directory is unchanged) and that no
traceback is printed.

Each case runs in its own process. Importing torch, transformers and ModelOpt costs seconds per
process, so the processes are forked from one that has imported the CLI and every command module
(``testing/forked_cli.ForkedCli``): a fork is a fresh process as far as the case can tell (own exit code, stdout,
stderr, cwd, signal handlers), running ``eagle3_trt.cli.main`` exactly as the ``eagle3-trt``
console script does. ``BAD_INPUTS_FRESH=1`` runs every case as ``python -m eagle3_trt.cli``
instead; ``test_fork_and_fresh_process_agree`` does so for a few cases on every run.

``pending="issue 11 <item>"`` marks a case a fix in progress is to make pass: it becomes
``xfail(strict=True)``, so the fix turns it into an XPASS failure that says to drop the flag.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3_trt.atomic import staged_dir
from eagle3_trt.pipeline.presets import PRESET_DIR
from eagle3_trt.testing.behaviour_cases import copy_embedded, permute_vocab
from eagle3_trt.testing.forked_cli import ForkedCli
from eagle3_trt.testing.tiny_pair import make_pair

REPO_ROOT = Path(__file__).resolve().parents[1]
CASE_TIMEOUT_S = 120
DELETE = object()


# ---------------------------------------------------------------------------------------------
# Running the CLI: forked from a process that has imported everything once (testing/forked_cli.py)
# ---------------------------------------------------------------------------------------------
@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def last_err_line(self) -> str:
        lines = [ln for ln in self.err.splitlines() if ln.strip()]
        return lines[-1] if lines else ""


def _fresh(argv: list[str], cwd: Path) -> Result:
    p = subprocess.run(
        [sys.executable, "-m", "eagle3_trt.cli", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CASE_TIMEOUT_S,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return Result(p.returncode, p.stdout, p.stderr)


@pytest.fixture(scope="module")
def cli():
    """run(argv, cwd) -> Result, in a new process per call."""
    if os.environ.get("BAD_INPUTS_FRESH"):
        yield _fresh
        return
    z = ForkedCli(CASE_TIMEOUT_S)

    def run(argv: list[str], cwd: Path) -> Result:
        p = z.run(argv, cwd)
        return Result(p.returncode, p.stdout, p.stderr)

    yield run
    z.close()


# ---------------------------------------------------------------------------------------------
# Inputs: the tiny pair, copied per case and broken on purpose
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    return make_pair(tmp_path_factory.mktemp("bad-inputs-pair"))


@pytest.fixture(scope="module")
def dry_bundle(cli, pair, tmp_path_factory) -> Path:
    """A --dry-run bundle (configs only, built in a fraction of a second): enough for every refusal
    of `alpha`, `recommend` and `package` that happens before a model is loaded."""
    d = tmp_path_factory.mktemp("bad-inputs-bundle")
    res = cli(["engine", "--model", "tiny", "--target-gpu", "h100", "--dry-run", "-o", str(d / "dry")], d)
    assert res.rc == 0, res.err
    return d / "dry"


@dataclass
class Ctx:
    """What a case's ``make`` gets: its own copy of the pair and a scratch directory."""

    w: Path  # the case's working directory (also the command's cwd)
    t: Path  # target copy
    d: Path  # draft copy
    bundle: Path  # the shared dry-run bundle (read-only for the cases)

    def fmt(self) -> dict[str, str]:
        return {"w": str(self.w), "t": str(self.t), "d": str(self.d), "b": str(self.bundle), "out": str(self.w / "out")}


def edit_json(path: Path, **changes) -> None:
    """Set (or, with DELETE, remove) fields; ``a__b`` is the nested field ``a.b``."""
    data = json.loads(path.read_text())
    for key, v in changes.items():
        *parents, last = key.split("__")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
        if v is DELETE:
            node.pop(last, None)
        else:
            node[last] = v
    path.write_text(json.dumps(data, indent=2))


def edit_tensors(path: Path, fn: Callable[[dict], dict]) -> None:
    save_file(fn(load_file(str(path))), str(path))


def tcfg(**kw) -> Callable[[Ctx], None]:
    return lambda c: edit_json(c.t / "config.json", **kw)


def dcfg(**kw) -> Callable[[Ctx], None]:
    return lambda c: edit_json(c.d / "config.json", **kw)


def dtensors(fn: Callable[[dict], dict]) -> Callable[[Ctx], None]:
    return lambda c: edit_tensors(c.d / "model.safetensors", fn)


def write(rel: str, content: str | bytes) -> Callable[[Ctx], None]:
    def make(c: Ctx) -> None:
        p = c.w / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())

    return make


def both(*makes: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
    def make(c: Ctx) -> None:
        for m in makes:
            m(c)

    return make


def _draft_vocab(n: int) -> Callable[[dict], dict]:
    """lm_head and d2t for a draft vocabulary of n tokens (consistent with a config that says so)."""

    def fn(t: dict) -> dict:
        out = {
            **t,
            "lm_head.weight": torch.zeros(n, t["lm_head.weight"].shape[1], dtype=t["lm_head.weight"].dtype),
            "d2t": torch.zeros(n, dtype=t["d2t"].dtype),
        }
        out.pop("t2d", None)
        return out

    return fn


def _without(name: str) -> Callable[[dict], dict]:
    return lambda t: {k: v for k, v in t.items() if k != name}


def _with(name: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[dict], dict]:
    return lambda t: {**t, name: fn(t[name])}


def _truncate(rel: str, keep: int = 100) -> Callable[[Ctx], None]:
    def make(c: Ctx) -> None:
        p = c.w / rel
        p.write_bytes(p.read_bytes()[:keep])

    return make


def _remove(rel: str) -> Callable[[Ctx], None]:
    def make(c: Ctx) -> None:
        p = c.w / rel
        shutil.rmtree(p) if p.is_dir() else p.unlink()

    return make


def _bom(rel: str) -> Callable[[Ctx], None]:
    """Prefix a UTF-8 byte-order mark, as some Windows editors save JSON."""

    def make(c: Ctx) -> None:
        p = c.w / rel
        p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())

    return make


def _header_lies(rel: str, tensor: str) -> Callable[[Ctx], None]:
    """Reverse one tensor's shape in a safetensors header: same byte count, so the file still opens."""

    def make(c: Ctx) -> None:
        p = c.w / rel
        b = p.read_bytes()
        n = int.from_bytes(b[:8], "little")
        header = json.loads(b[8 : 8 + n])
        header[tensor]["shape"] = header[tensor]["shape"][::-1]
        hb = json.dumps(header).encode()
        hb += b" " * (-len(hb) % 8)
        p.write_bytes(len(hb).to_bytes(8, "little") + hb + b[8 + n :])

    return make


def _pickle_bin(wrap: Callable[[dict], object]) -> Callable[[Ctx], None]:
    """Replace the draft's safetensors by a pytorch_model.bin holding ``wrap(tensors)``."""

    def make(c: Ctx) -> None:
        tensors = load_file(str(c.d / "model.safetensors"))
        (c.d / "model.safetensors").unlink()
        torch.save(wrap(tensors), c.d / "pytorch_model.bin")

    return make


class _Evil:
    """Unpickling this would run a command: torch's weights-only loader must refuse it."""

    def __reduce__(self):
        return (os.system, ("touch /tmp/eagle3-trt-bad-inputs-pwned",))


def _swap_token_ids(tok_a: str, id_b: int) -> Callable[[Ctx], None]:
    """The target's tokenizer with ``tok_a`` and the token at ``id_b`` trading ids (a tokenizer of another
    revision); config.json still names the old ids."""

    def make(c: Ctx) -> None:
        p = c.t / "tokenizer.json"
        data = json.loads(p.read_text())
        vocab = data["model"]["vocab"]
        id_a = vocab[tok_a] if tok_a in vocab else next(t["id"] for t in data["added_tokens"] if t["content"] == tok_a)
        tok_b = next(k for k, v in vocab.items() if v == id_b)
        for t in data["added_tokens"]:
            if t["content"] == tok_a:
                t["id"] = id_b
        if tok_a in vocab:
            vocab[tok_a] = id_b
        vocab[tok_b] = id_a
        p.write_text(json.dumps(data))

    return make


def _draft_tokenizer(mutate: Callable[[dict], None]) -> Callable[[Ctx], None]:
    """The draft ships a copy of the target's tokenizer, changed by ``mutate``."""

    def make(c: Ctx) -> None:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(c.t / f, c.d / f)
        data = json.loads((c.d / "tokenizer.json").read_text())
        mutate(data)
        (c.d / "tokenizer.json").write_text(json.dumps(data))

    return make


def _rename_vocab_entry(data: dict) -> None:
    vocab = data["model"]["vocab"]
    k = next(k for k, v in vocab.items() if v == 300)
    vocab["zz-not-in-the-target"] = vocab.pop(k)


def _move_added_token(data: dict) -> None:
    tok = next(t for t in data["added_tokens"] if t["content"] == "<|eot_id|>")
    tok["id"] = 5 if tok["id"] != 5 else 4


def _evil_preset(c: Ctx) -> None:
    """A preset file outside the registry, reached through ``--model ../../...``."""
    (c.w / "evil.yaml").write_text((PRESET_DIR / "tiny.yaml").read_text())


def _evil_model_arg(c: Ctx) -> str:
    return os.path.relpath(c.w / "evil", PRESET_DIR)


def _copy_bundle(c: Ctx) -> None:
    shutil.copytree(c.bundle, c.w / "out")


ROPE_L3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def _bundle_target(**changes) -> Callable[[Ctx], None]:
    """A copy of the bundle at out/ whose target config.json is edited by hand (``edit_json``'s spelling)."""

    def make(c: Ctx) -> None:
        _copy_bundle(c)
        edit_json(c.w / "out" / "target" / "config.json", **changes)

    return make


def _assert_rope_block(path: Path, original: int) -> None:
    cfg = json.loads(path.read_text())
    assert cfg["rope_scaling"]["original_max_position_embeddings"] == original == cfg["rope_parameters"]["original_max_position_embeddings"]
    assert cfg["original_max_position_embeddings"] == original and cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"]


def _spec_options(schedule: Callable[[int], dict] | None = None, **top) -> Callable[[Ctx], None]:
    """A copy of the bundle at out/ whose llm_api_options.yaml gets ``schedule(K)`` merged into its
    speculative_config (K: the bundle's max_draft_len) and ``top`` into the top level."""

    def make(c: Ctx) -> None:
        import yaml  # local: only these cases edit YAML

        _copy_bundle(c)
        path = c.w / "out" / "llm_api_options.yaml"
        opts = yaml.safe_load(path.read_text())
        opts["speculative_config"].pop("max_concurrency", None)
        if schedule is not None:
            opts["speculative_config"].update(schedule(opts["speculative_config"]["max_draft_len"]))
        opts.update(top)
        path.write_text(yaml.safe_dump(opts))

    return make


def _dynamic_tree_options(target: dict | None = None, **spec) -> Callable[[Ctx], None]:
    """``_spec_options`` turning on TensorRT-LLM's dynamic tree (topK 4 and ``spec``), the bundle's
    target config.json changed by ``target`` (e.g. a sliding window)."""
    base = _spec_options(lambda k: {"use_dynamic_tree": True, "dynamic_tree_max_topK": 4, **spec})

    def make(c: Ctx) -> None:
        base(c)
        if target:
            edit_json(c.w / "out" / "target" / "config.json", **target)

    return make


def _stale_staging(c: Ctx) -> None:
    """What a SIGKILLed build leaves: its staging directory, named with its (now dead) pid."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    (c.w / f".out.tmp-{p.pid}-dead").mkdir()
    (c.w / f".out.tmp-{p.pid}-dead" / "half.safetensors").write_bytes(b"x" * 100)


def _gpt_oss(mutate: Callable[[dict], None] | None = None) -> Callable[[Ctx], None]:
    """A copy of the embedded tiny-gpt-oss pair (MXFP4 experts) in {w}/go, its target's tensors changed by ``mutate``."""

    def make(c: Ctx) -> None:
        for part in ("target", "draft"):
            shutil.copytree(REPO_ROOT / "models" / "tiny-gpt-oss" / part, c.w / "go" / part)
        if mutate is not None:
            f = c.w / "go" / "target" / "model.safetensors"
            sd = load_file(str(f))
            mutate(sd)
            save_file(sd, str(f))

    return make


def _embedded(name: str, into: str | None = None, **target_cfg) -> Callable[[Ctx], None]:
    """A copy of the embedded pair models/<name> in {w}/<into or name>, its target config.json changed by ``target_cfg``."""

    def make(c: Ctx) -> None:
        for part in ("target", "draft"):
            shutil.copytree(REPO_ROOT / "models" / name / part, c.w / (into or name) / part)
        edit_json(c.w / (into or name) / "target" / "config.json", **target_cfg)

    return make


def _behaviour_case(name: str, permuted: bool = False, draft_from: str | None = None) -> Callable[[Ctx], None]:
    """models/<name> copied to {w}/bt, its vocabulary ids shuffled or its head taken from another pair:
    every file check passes, the behaviour checks refuse it (eagle3_trt/testing/behaviour_cases.py)."""

    def make(c: Ctx) -> None:
        t, _d = copy_embedded(name, c.w / "bt", draft_from=draft_from)
        if permuted:
            permute_vocab(t)

    return make


def _report(c: Ctx, body: dict) -> None:
    (c.w / "report.json").write_text(json.dumps(body))


def _alpha_report_json(cumulative: list[float]) -> dict:
    """A well-formed alpha report.json measuring ``cumulative`` acceptance (formats/alpha_report.py)."""
    from eagle3_trt.formats.alpha_report import report_json
    from eagle3_trt.testing.alpha_reports import alpha_report

    rep = alpha_report()
    rep.pairs.bundle.overall.cumulative_acceptance = cumulative
    return report_json(rep)


def _packaged_then_edited(c: Ctx) -> None:
    """A repository `package` wrote, whose model.yaml the user then edited (the README invites it)."""
    from eagle3_trt.triton_serving.package import package_bundle

    package_bundle(c.bundle, c.w / "repo")
    my = c.w / "repo" / "eagle3" / "1" / "model.yaml"
    my.write_text(my.read_text() + "# my edit\n")


def _triton_running(c: Ctx) -> None:
    """A repository of the dry bundle, and a state directory whose server.json records a live process
    (this test's own pid): what `serve` finds when the user's first server is still up."""
    from eagle3_trt.triton_serving.package import package_bundle
    from eagle3_trt.triton_serving.server import ServerHandle

    package_bundle(c.bundle, c.w / "repo")
    (c.w / "state").mkdir()
    ServerHandle(os.getpid(), str(c.w / "repo"), 18000, 18001, 18002, str(c.w / "state" / "tritonserver.log"), str(c.w / "state")).save()


def _packaged(c: Ctx) -> None:
    """A repository `package` wrote for the dry bundle, and no server."""
    from eagle3_trt.triton_serving.package import package_bundle

    package_bundle(c.bundle, c.w / "repo")


def _deploy_other_target(c: Ctx) -> None:
    """A repository `package` wrote for the dry bundle, and a copy of that bundle at other/ whose
    manifest records another target checkpoint: a head for another target, handed to `deploy`."""
    from eagle3_trt.triton_serving.package import package_bundle

    package_bundle(c.bundle, c.w / "repo")
    shutil.copytree(c.bundle, c.w / "other")
    m = c.w / "other" / "manifest.json"
    man = json.loads(m.read_text())
    name = sorted(man["sources"]["target"]["files"])[0]
    man["sources"]["target"]["files"][name]["sha256"] = "0" * 64
    man["sources"]["target"]["source"] = "someone/other-target"
    m.write_text(json.dumps(man, indent=2))


def _traffic(n: int, fingerprint: str | None = None, truncate: bool = False, other_target: bool = False, lineage: bool = False) -> Callable[[Ctx], None]:
    """``n`` captured records in cap/ (through SegmentWriter, 8 a segment) served by the shared bundle (or
    ``fingerprint``); ``truncate``: the second segment loses its tail; ``other_target``: a copy of the
    bundle at other/ whose manifest records another target checkpoint; ``lineage``: a copy at child/
    whose manifest says it was trained on cap/ beside the held-back split of seed 0, fraction 0.5."""

    def make(c: Ctx) -> None:
        from eagle3_trt.formats.traffic import CapturedSampling, SegmentWriter, ServedAcceptance, TrafficRecord

        fp = fingerprint or json.loads((c.bundle / "manifest.json").read_text())["fingerprint"]
        w = SegmentWriter(c.w / "cap", segment_records=8)
        for i in range(n):
            acc = ServedAcceptance(speculative=True, draft_tokens=9, accepted_draft_tokens=5, target_forwards=4, completion_tokens=9)
            w.write(
                TrafficRecord(
                    request_id=f"r{i}",
                    time_unix=1e9 + i,
                    bundle_fingerprint=fp,
                    model="eagle3",
                    frontend="triton",
                    chat=False,
                    prompt_text=None,
                    prompt_ids=[5 + i, 6 + 2 * i, 7 + 3 * i, 11 + i, 13, 17 + i],
                    output_ids=[1] * 9,
                    finish_reason="length",
                    sampling=CapturedSampling(max_tokens=9),
                    acceptance=acc,
                )
            )
        w.flush()
        if truncate:
            seg = sorted((c.w / "cap").glob("traffic-*.jsonl"))[1]
            seg.write_bytes(seg.read_bytes()[:-30])
        if other_target:
            shutil.copytree(c.bundle, c.w / "other")
            m = c.w / "other" / "manifest.json"
            man = json.loads(m.read_text())
            name = sorted(man["sources"]["target"]["files"])[0]
            man["sources"]["target"]["files"][name]["sha256"] = "0" * 64
            m.write_text(json.dumps(man, indent=2))
        if lineage:
            shutil.copytree(c.bundle, c.w / "child")
            m = c.w / "child" / "manifest.json"
            man = json.loads(m.read_text())
            man["lineage"] = {"parent_fingerprint": fp, "traffic_digest": "0" * 64, "traffic_dir": str(c.w / "cap"), "heldout_seed": 0, "heldout_fraction": 0.5}
            m.write_text(json.dumps(man, indent=2))

    return make


def _dynamo_running(c: Ctx) -> None:
    """A serve-dynamo state directory recording a live frontend (this test's own pid) and a dead worker."""
    from eagle3_trt.dynamo_serving.launcher import Deployment, Proc

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    s = c.w / "dstate"
    s.mkdir()
    fe = Proc("frontend", os.getpid(), 18080, str(s / "frontend.log"))
    Deployment(str(s), str(c.bundle), "eagle3", "http://127.0.0.1:18080/v1", str(s / "discovery"), fe, [Proc("worker-0", dead.pid, 20001, "w0.log")]).save()


# ---------------------------------------------------------------------------------------------
# The corpus
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # formatted with Ctx.fmt(): {w} {t} {d} {b} {out}; {model} from model_arg
    rc: int
    pattern: str  # regex searched in the last stderr line (refusals) or stdout + stderr (rc 0)
    make: Callable[[Ctx], None] | None = None
    pending: str | None = None  # "issue 11 <item>": xfail(strict) until the fix lands
    absent: tuple[str, ...] = ()  # text that must not appear in stderr (e.g. a stage that must not start)
    model_arg: Callable[[Ctx], str] | None = None
    around: str | None = None  # "lock": the test holds the output's lock while the case runs; "tmpfs": a full disk
    root_only: bool = False
    changes: tuple[str, ...] = ()  # entries of the case's directory the command is meant to write or remove (prefixes)
    check: Callable[[Ctx], None] | None = None  # more assertions after the run


V = ("validate", "--target", "{t}", "--draft", "{d}")
GV = ("validate", "--target", "{w}/go/target", "--draft", "{w}/go/draft")
QV = ("validate", "--target", "{w}/tiny-qwen3/target", "--draft", "{w}/tiny-qwen3/draft")
E = ("engine", "--model", "tiny", "--target", "{t}", "--draft", "{d}", "--target-gpu", "h100", "-o", "{out}")
ED = (*E, "--dry-run")
GOOD_PROMPTS = '{"turns": ["Write a haiku about the sea."]}\n'

CASES: list[Case] = [
    # ---- files and directories
    Case("target-dir-missing", ("validate", "--target", "{w}/nope", "--draft", "{d}"), 2, r"/nope: directory does not exist"),
    Case("target-config-missing", V, 2, r"target/config\.json: file not found", make=_remove("target/config.json")),
    Case("target-config-truncated", V, 2, r"target/config\.json: not valid JSON", make=_truncate("target/config.json", 40)),
    Case("target-config-not-object", V, 2, r"target/config\.json: expected a JSON object", make=write("target/config.json", "[1, 2]")),
    Case(
        "target-config-bom",
        V,
        2,
        r"target/config\.json: starts with a UTF-8 byte-order mark \(hint: save it as UTF-8 without a BOM",
        make=_bom("target/config.json"),
    ),
    Case(
        "draft-config-trailing-comma",
        V,
        2,
        r"draft/config\.json: not valid JSON \(Expecting property name",
        make=lambda c: (c.d / "config.json").write_text((c.d / "config.json").read_text().rstrip().rstrip("}").rstrip() + ",\n}"),
    ),
    Case(
        "target-header-lies-about-shape",
        V,
        2,
        r"target:model\.layers\.0\.mlp\.gate_proj\.weight: shape \(\d+, \d+\), config\.json implies",
        make=_header_lies("target/model.safetensors", "model.layers.0.mlp.gate_proj.weight"),
    ),
    Case("target-field-missing", V, 2, r"target/config\.json:num_hidden_layers: missing", make=tcfg(num_hidden_layers=DELETE)),
    Case("target-not-llama", V, 2, r"target/config\.json:model_type: 'gpt2' is not a target family eagle3-trt knows", make=tcfg(model_type="gpt2")),
    Case("target-no-architectures", V, 2, r"target/config\.json:architectures: missing", make=tcfg(architectures=DELETE)),
    Case(
        "target-already-quantized",
        V,
        2,
        r"target/hf_quant_config\.json: target is already quantized",
        make=write("target/hf_quant_config.json", '{"quantization": {"quant_algo": "FP8"}}'),
    ),
    Case("target-dtype-int8", V, 2, r"target/config\.json:(torch_)?dtype: int8 not supported", make=tcfg(torch_dtype="int8", dtype="int8")),
    Case("target-no-weights", V, 2, r"target: no weight files", make=_remove("target/model.safetensors")),
    Case("target-weights-truncated", V, 2, r"target/model\.safetensors: corrupt or truncated safetensors", make=_truncate("target/model.safetensors", 5000)),
    Case(
        "target-shard-missing",
        V,
        2,
        r"target/model\.safetensors\.index\.json: shards listed but missing: model-00002",
        make=write("target/model.safetensors.index.json", '{"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}'),
    ),
    Case("target-fewer-layers-than-config", V, 2, r"target.*model\.layers\.8\.self_attn\.q_proj\.weight missing", make=tcfg(num_hidden_layers=9)),
    Case("target-too-shallow-for-eagle3", V, 2, r"default aux layers \[1, 1, 0\] are not distinct", make=tcfg(num_hidden_layers=4)),
    Case("target-no-tokenizer", V, 2, r"target/tokenizer\.json: target has no tokenizer\.json", make=_remove("target/tokenizer.json")),
    # ---- issue 11 B: the target's tokenizer against its own config
    Case(
        "target-tokenizer-swapped-bos",
        V,
        2,
        r"target/(generation_)?config\.json:bos_token_id: 0, but the tokenizer's bos_token .* is id 300",
        make=_swap_token_ids("<|begin_of_text|>", 300),
    ),
    Case("target-config-bos-out-of-vocab", V, 2, r"target/config\.json:bos_token_id: id 9999 is outside the vocabulary", make=tcfg(bos_token_id=9999)),
    # ---- issue 11 B: one schema for config fields, in validate and engine alike
    Case("hidden-size-string-validate", V, 2, r"target/config\.json:hidden_size", make=tcfg(hidden_size="64")),
    Case("hidden-size-string-engine", ED, 2, r"target/config\.json:hidden_size", make=tcfg(hidden_size="64")),
    Case("hidden-size-words-validate", V, 2, r"target/config\.json:hidden_size", make=tcfg(hidden_size="two-fifty-six")),
    Case("hidden-size-words-engine", ED, 2, r"target/config\.json:hidden_size", make=tcfg(hidden_size="two-fifty-six")),
    # ---- draft: layout, config, tensors
    Case("draft-not-eagle3", V, 2, r"draft: not an EAGLE-3 head", make=dtensors(lambda t: {k.replace("midlayer.", "block."): v for k, v in t.items()})),
    Case("draft-field-missing", V, 2, r"draft/config\.json:num_attention_heads: missing", make=dcfg(num_attention_heads=DELETE)),
    Case("draft-hidden-size-string", V, 2, r"draft/config\.json:hidden_size: must be a valid integer", make=dcfg(hidden_size="64")),
    Case("draft-hidden-size-string-engine", ED, 2, r"draft/config\.json:hidden_size: must be a valid integer", make=dcfg(hidden_size="64")),
    Case("draft-two-layers", V, 2, r"draft/config\.json:num_hidden_layers: 2 draft decoder layers", make=dcfg(num_hidden_layers=2)),
    Case("draft-vocab-mismatch", V, 2, r"draft/config\.json:vocab_size: draft was trained for a vocabulary of 1024", make=dcfg(vocab_size=1024)),
    Case(
        "draft-target-hidden-mismatch",
        V,
        2,
        r"draft/config\.json:target_hidden_size: 128 but the target's hidden_size is 64",
        make=dcfg(target_hidden_size=128),
    ),
    Case("draft-fc-missing", V, 2, r"draft: tensor fc\.weight missing", make=dtensors(_without("fc.weight"))),
    Case(
        "draft-fc-odd-width",
        V,
        2,
        r"draft:fc\.weight: in_features 100 is not a multiple of the target hidden size 64",
        make=dtensors(_with("fc.weight", lambda w: w[:, :100].contiguous())),
    ),
    Case("draft-shape-vs-config", V, 2, r"draft:midlayer\.mlp\.\w+_proj\.weight: shape .* expected .* from config\.json", make=dcfg(intermediate_size=256)),
    Case("draft-tensor-missing", V, 2, r"draft: tensor midlayer\.mlp\.down_proj\.weight missing", make=dtensors(_without("midlayer.mlp.down_proj.weight"))),
    Case(
        "draft-weight-int8",
        V,
        2,
        r"draft:midlayer\.mlp\.down_proj\.weight: dtype (torch\.)?int8 not supported",
        make=dtensors(_with("midlayer.mlp.down_proj.weight", lambda w: w.to(torch.int8))),
    ),
    Case("draft-bin-pickle-code", V, 2, r"draft/pytorch_model\.bin: refused: not a plain tensor checkpoint", make=_pickle_bin(lambda t: {**t, "x": _Evil()})),
    Case(
        "draft-bin-not-a-mapping",
        V,
        2,
        r"draft/pytorch_model\.bin: refused: holds something other than a name -> tensor mapping",
        make=_pickle_bin(lambda t: list(t.values())),
    ),
    # ---- aux layers
    Case(
        "aux-out-of-range",
        V,
        2,
        r"draft/config\.json:eagle_aux_hidden_state_layer_ids: aux layer ids \[9\] outside the target's 8 layers \(ids 0\.\.7 in this file's numbering\)",
        make=dcfg(eagle_config__eagle_aux_hidden_state_layer_ids=[1, 3, 9]),
    ),
    Case("aux-not-distinct", V, 2, r"aux layer ids \[1, 1, 4\] are not distinct", make=dcfg(eagle_config__eagle_aux_hidden_state_layer_ids=[1, 1, 4])),
    Case(
        "aux-count-vs-fc",
        V,
        2,
        r"2 aux layers \[1, 4\] but fc\.weight fuses 3 target hidden states",
        make=dcfg(eagle_config__eagle_aux_hidden_state_layer_ids=[1, 4]),
    ),
    # ---- draft vocabulary map
    Case("d2t-missing", V, 2, r"draft:d2t: missing, but draft_vocab_size 256 < vocab_size 512", make=dtensors(_without("d2t"))),
    Case("d2t-float", V, 2, r"draft:d2t: dtype torch\.float32, expected an integer tensor", make=dtensors(_with("d2t", lambda t: t.float()))),
    Case(
        "d2t-absolute-ids",
        V,
        2,
        r"draft:d2t: maps draft ids to target ids in \[\d+, \d+\], outside 0\.\.511",
        make=dtensors(_with("d2t", lambda t: t + torch.arange(t.numel()) + 300)),
    ),
    Case(
        "d2t-not-injective",
        V,
        2,
        r"draft:d2t: not injective",
        make=dtensors(lambda t: {**_without("t2d")(t), "d2t": -torch.arange(t["d2t"].numel(), dtype=t["d2t"].dtype)}),
    ),
    Case("t2d-disagrees", V, 2, r"draft:t2d: disagrees with d2t", make=dtensors(_with("t2d", lambda t: ~t))),
    Case(
        "draft-vocab-too-big",
        V,
        2,
        r"draft/config\.json:draft_vocab_size: 600 exceeds the target vocab 512",
        make=both(dcfg(draft_vocab_size=600), dtensors(_draft_vocab(600))),
    ),
    # ---- tokenizers and special ids
    Case("draft-tokenizer-other-vocab", V, 2, r"draft/tokenizer\.json: draft tokenizer vocabulary differs", make=_draft_tokenizer(_rename_vocab_entry)),
    Case(
        "draft-tokenizer-special-id",
        V,
        2,
        r"draft/tokenizer\.json: special token '<\|eot_id\|>' is id \d+ in the draft but \d+ in the target",
        make=_draft_tokenizer(_move_added_token),
    ),
    Case("draft-eos-foreign", V, 2, r"draft/config\.json:eos_token_id: \[300\] shares no id with the target's", make=dcfg(eos_token_id=300)),
    Case("draft-bos-foreign", V, 2, r"draft/config\.json:bos_token_id: 7 but the target's is 0", make=dcfg(bos_token_id=7)),
    # ---- rope (issue 11 A: what the runtime lacks is refused at validate)
    Case("rope-unknown-type", V, 2, r"draft/config\.json:rope_scaling: .*'fancy'", make=dcfg(rope_scaling={"rope_type": "fancy", "factor": 2.0})),
    Case("rope-theta-negative", V, 2, r"draft/config\.json:rope_theta", make=dcfg(rope_theta=-1.0)),
    Case(
        "rope-yarn-draft-warns",
        V,
        0,
        r"warn .*draft rope .*yarn.* differs from the target's",
        make=dcfg(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}),
    ),
    Case(
        "rope-partial-rotary",
        V,
        2,
        r"draft/config\.json:partial_rotary_factor: 0\.5: TensorRT-LLM's Eagle3 draft would rotate the first 8 of 16",
        make=dcfg(partial_rotary_factor=0.5),
    ),
    # ---- issue 21 A: the target's rope as TensorRT-LLM reads it (tests/test_rope_types.py measures the accepted ones)
    Case("rope-draft-full-rotary-dim", V, 0, r"ok +rope +draft rope_theta 10000, none", make=dcfg(rotary_dim=16, partial_rotary_factor=1.0)),
    Case(
        "rope-target-partial-rotary-measured",
        V,
        0,
        r"warn .*target rotates the first 8 of 16 channels of each head, as TensorRT-LLM's llama reads",
        make=tcfg(partial_rotary_factor=0.5),
    ),
    Case(
        "rope-target-rotary-emb-base",
        V,
        2,
        r"target/config\.json:rotary_emb_base: 10000: TensorRT-LLM reads rotary_emb_base as the rotary dim",
        make=tcfg(rotary_emb_base=10000),
    ),
    Case("rope-target-odd-rotary-dim", V, 2, r"target/config\.json:rotary_dim: gives a rotary dim of 7 for head_dim 16", make=tcfg(rotary_dim=7)),
    Case("rope-target-oversized-rotary", ED, 2, r"target/config\.json:rotary_pct: gives a rotary dim of 32 for head_dim 16", make=tcfg(rotary_pct=2.0)),
    Case(
        "rope-qwen3-rotary-pct",
        QV,
        2,
        r"tiny-qwen3/target/config\.json:rotary_pct: 0\.5 gives TensorRT-LLM's generic rope a rotary dim of \d+, but its Qwen3 fused",
        make=_embedded("tiny-qwen3", rotary_pct=0.5),
    ),
    Case(
        "rope-gpt-oss-partial-rotary",
        GV,
        2,
        r"go/target/config\.json:partial_rotary_factor: 0\.5: partial rotary .*silently rotates the whole head",
        make=_embedded("tiny-gpt-oss", partial_rotary_factor=0.5, into="go"),
    ),
    Case(
        "rope-empty-type-beside-rope-type",
        V,
        2,
        r"target/config\.json:rope_scaling\.type: '' while rope_type is 'yarn'",
        make=tcfg(rope_scaling={"type": "", "rope_type": "yarn", "factor": 2.0}),
    ),
    Case(
        "rope-type-beats-rope-type",
        V,
        0,
        r"target rope_theta 10000, linear factor 2",
        make=tcfg(rope_scaling={"type": "linear", "rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": 64}),
    ),
    Case(  # issue 27: two values for one key; TensorRT-LLM 1.2 takes the top level's, releases on transformers 5 the block's
        "rope-llama3-top-level-original-max",
        V,
        2,
        r"target/config\.json:original_max_position_embeddings: 64, but rope_scaling\.original_max_position_embeddings is 512: TensorRT-LLM 1\.2 .*hint: write one value",
        make=tcfg(
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 512},
            original_max_position_embeddings=64,
        ),
    ),
    Case(
        "rope-longrope-names-the-value-used",
        V,
        2,
        r"target/config\.json:max_position_embeddings: longrope table has 16 rows \(max_position_embeddings 8, original_max_position_embeddings 16\)",
        make=tcfg(
            rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
            original_max_position_embeddings=16,
            max_position_embeddings=8,
        ),
    ),
    # ---- issue 27: one rope block (formats/rope_block.py); a value spelled twice with two values is refused naming both
    Case(
        "rope-partial-top-vs-rope-parameters",
        V,
        2,
        r"target/config\.json:partial_rotary_factor: 0\.5, but rope_parameters\.partial_rotary_factor is 1\.0: TensorRT-LLM 1\.2 .*serves the top-level value",
        make=tcfg(rope_theta=10000.0, partial_rotary_factor=0.5, rope_parameters={"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 1.0}),
    ),
    Case(
        "rope-llama3-original-top-vs-rope-parameters",
        ED,
        2,
        r"target/config\.json:original_max_position_embeddings: 128, but rope_parameters\.original_max_position_embeddings is 200000",
        make=tcfg(
            rope_theta=10000.0,
            original_max_position_embeddings=128,
            rope_scaling=DELETE,
            rope_parameters={"rope_theta": 10000.0, **ROPE_L3, "original_max_position_embeddings": 200000},
        ),
    ),
    Case(
        "rope-theta-top-vs-rope-parameters",
        V,
        2,
        r"target/config\.json:rope_theta: 500000\.0, but rope_parameters\.rope_theta is 10000\.0",
        make=tcfg(rope_theta=500000.0, rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}),
    ),
    Case(
        "rope-draft-theta-two-values",
        V,
        2,
        r"draft/config\.json:rope_theta: 10000\.0, but rope_parameters\.rope_theta is 500000\.0",
        make=dcfg(rope_theta=10000.0, rope_parameters={"rope_theta": 500000.0, "rope_type": "default"}),
    ),
    Case(  # the key at the top level only: measured with it, and written into the bundle's rope_scaling (transformers 4.57 needs it there)
        "rope-llama3-top-level-only-written-out",
        ED,
        0,
        r"dry run: configs only",
        make=tcfg(rope_theta=10000.0, original_max_position_embeddings=64, rope_scaling=ROPE_L3, rope_parameters=DELETE),
        changes=("out",),
        check=lambda c: _assert_rope_block(c.w / "out" / "target" / "config.json", 64),
    ),
    Case(
        "release-rope-llama3-key-dropped-1.2",
        ("compile", "{w}/out", "--check-only", "--trtllm-version", "1.2.1"),
        2,
        r"out/target/config\.json:rope_scaling: has no original_max_position_embeddings: transformers 4\.57 raises KeyError",
        make=_bundle_target(original_max_position_embeddings=64, rope_scaling=ROPE_L3, rope_parameters=DELETE),
    ),
    Case(
        "release-rope-llama3-key-dropped-1.4",
        ("compile", "{w}/out", "--check-only", "--trtllm-version", "1.4.0rc1"),
        2,
        r"out/target/config\.json:rope: TensorRT-LLM 1\.4\.0rc1 \(transformers 5\) serves .*original_max_position_embeddings 4096; "
        r"the reference runtime measured .*original_max_position_embeddings 64",
        make=_bundle_target(original_max_position_embeddings=64, rope_scaling=ROPE_L3, rope_parameters=DELETE),
    ),
    Case(
        "release-rope-partial-in-rope-parameters-only-1.2",
        ("compile", "{w}/out", "--check-only", "--trtllm-version", "1.2.1"),
        2,
        r"TensorRT-LLM 1\.2\.1 \(transformers 4\.57\) serves rope_theta 100000, none; the reference runtime measured rope_theta 100000, none, rotary dim 32 of head_dim 64",
        make=_bundle_target(
            partial_rotary_factor=DELETE, rope_theta=100000.0, rope_parameters={"rope_theta": 100000.0, "rope_type": "default", "partial_rotary_factor": 0.5}
        ),
    ),
    Case(
        "release-rope-partial-in-rope-parameters-only-1.4",
        ("compile", "{w}/out", "--check-only", "--trtllm-version", "1.4.0rc1"),
        0,
        r"rope as TensorRT-LLM 1\.4\.0rc1 reads it",
        make=_bundle_target(
            partial_rotary_factor=DELETE, rope_theta=100000.0, rope_parameters={"rope_theta": 100000.0, "rope_type": "default", "partial_rotary_factor": 0.5}
        ),
    ),
    # ---- variant flags (issue 11 A: implemented as TensorRT-LLM does, or refused)
    Case(
        "flag-not-boolean",
        V,
        2,
        r"draft/config\.json:eagle_config\.return_hidden_post_norm: 'false' is not true/false",
        make=dcfg(eagle_config__return_hidden_post_norm="false"),
    ),
    Case("flag-post-norm-honoured", V, 0, r"variants: return_hidden_post_norm", make=dcfg(eagle_config__return_hidden_post_norm=True)),
    Case("flag-mla-head", V, 2, r"draft/config\.json:kv_lora_rank", make=dcfg(kv_lora_rank=16)),
    # issue 27: every producer and TensorRT-LLM concatenate aux states in ascending layer order: not permuted
    Case("aux-unsorted-ascending", V, 0, r"listed as \[4, 1, 3\].*ascending layer order", make=dcfg(eagle_config__eagle_aux_hidden_state_layer_ids=[4, 1, 3])),
    # ---- engine: presets and options
    Case("preset-unknown", ("engine", "--model", "nope", "--dry-run", "-o", "{out}"), 2, r"MODEL: unknown preset 'nope'"),
    Case(
        "preset-path-escape", ("engine", "--model", "{model}", "--dry-run", "-o", "{out}"), 2, r"unknown preset", make=_evil_preset, model_arg=_evil_model_arg
    ),
    Case("gpu-unknown", ("engine", "--model", "tiny", "--target-gpu", "z999", "--dry-run", "-o", "{out}"), 2, r"--target-gpu: unknown GPU 'z999'"),
    Case(
        "nvfp4-on-hopper",
        ("engine", "--model", "tiny", "--target-gpu", "h100", "--quant", "nvfp4", "--dry-run", "-o", "{out}"),
        2,
        r"--quant: nvfp4 needs Blackwell.*h100 is hopper",
    ),
    Case(
        "fp8-on-ampere",
        ("engine", "--model", "tiny", "--target-gpu", "a100", "--quant", "fp8", "--dry-run", "-o", "{out}"),
        2,
        r"--quant: fp8 needs .*a100 is ampere",
    ),
    Case("nvfp4-kv-on-hopper", ("engine", "--model", "tiny", "--target-gpu", "h100", "--kv-cache", "nvfp4", "--dry-run", "-o", "{out}"), 2, r"--kv-cache"),
    Case("engine-k-zero", (*ED, "--max-draft-len", "0"), 2, r"--max-draft-len: 0 \(hint: draft lengths are 1\.\.16\)"),
    Case("engine-k-too-long", (*ED, "--max-draft-len", "17"), 2, r"--max-draft-len: 17 \(hint: draft lengths are 1\.\.16\)"),
    Case(
        "quantize-draft-bf16",
        ("engine", "--model", "tiny", "--target-gpu", "h100", "--quant", "bf16", "--quantize-draft", "--dry-run", "-o", "{out}"),
        2,
        r"--quantize-draft: the target format is bf16",
    ),
    Case(
        "draft-quant-nvfp4-on-hopper",
        ("engine", "--model", "tiny", "--target-gpu", "h100", "--quantize-draft", "--draft-quant", "nvfp4", "--dry-run", "-o", "{out}"),
        2,
        r"--draft-quant: nvfp4 needs Blackwell",
    ),
    Case(
        "embedded-half-override",
        ("engine", "--model", "tiny", "--target", "{t}", "--target-gpu", "h100", "--dry-run", "-o", "{out}"),
        2,
        r"TARGET/DRAFT: the embedded preset needs both or neither overridden",
    ),
    Case(
        "output-parent-is-a-file",
        ("engine", "--model", "tiny", "--target-gpu", "h100", "--dry-run", "-o", "{w}/afile/out"),
        2,
        r"/afile: is not a directory",
        make=write("afile", "x"),
    ),
    Case("output-locked-by-another-build", ED, 2, r"/out: another process \(pid \d+\) is writing it right now", around="lock"),
    # ---- issue 11 C: cache hits re-verify, stale staging directories of killed builds are removed
    Case(
        "cache-hit-reverifies-digests",
        ("engine", "--model", "tiny", "--target-gpu", "h100", "--dry-run", "-o", "{out}"),
        0,
        r"rebuilding .*/out: it does not match its manifest: draft/config\.json: missing",
        make=both(_copy_bundle, _remove("out/draft/config.json")),
        changes=("out",),
        check=lambda c: json.loads((c.w / "out" / "draft" / "config.json").read_text()),
    ),
    Case(
        "stale-staging-removed-on-cache-hit",
        ("engine", "--model", "tiny", "--target-gpu", "h100", "--dry-run", "-o", "{out}"),
        0,
        r"cache hit",
        make=both(_copy_bundle, _stale_staging),
        changes=(".out.tmp-",),
    ),
    Case(
        "stale-staging-removed-on-build",
        ("engine", "--model", "tiny", "--target-gpu", "h100", "--dry-run", "-o", "{out}"),
        0,
        r"bundle: \S*/out\n",
        make=_stale_staging,
        changes=("out", ".out.tmp-"),
    ),
    Case(
        "output-disk-full",
        ("engine", "--model", "tiny", "--target-gpu", "h100", "--dry-run", "-o", "{w}/small/out"),
        2,
        r"small/out: no space left on the device while writing it; nothing was written",
        around="tmpfs",
        root_only=True,
    ),
    # ---- calibration input (issue 11 B: checked before the target is loaded)
    Case("calib-missing", (*E, "--calib", "{w}/missing.jsonl"), 2, r"missing\.jsonl: prompt file not found", absent=("load target",)),
    # the build's held-out check: refused before the GPU probe, nothing built
    Case("heldout-missing", (*E, "--heldout-prompts", "{w}/none.jsonl"), 2, r"none\.jsonl: prompt file not found", absent=("load target",)),
    Case(
        "heldout-not-json",
        (*E, "--heldout-prompts", "{w}/h.jsonl"),
        2,
        r"h\.jsonl:2: not valid JSON",
        make=write("h.jsonl", '{"text": "def f(x):"}\nclass A:\n'),
        absent=("load target",),
    ),
    Case(
        "calib-bad-json",
        (*E, "--calib", "{w}/bad.jsonl"),
        2,
        r"bad\.jsonl:2: not valid JSON",
        absent=("load target",),
        make=write("bad.jsonl", GOOD_PROMPTS + '{"turns": ["unterminated\n'),
    ),
    Case("calib-max-length-over-context", (*E, "--calib-max-length", "200000"), 2, r"--calib-max-length: 200000 .*1024", absent=("load target",)),
    # ---- bundles given to alpha / recommend / package
    Case(
        "alpha-bundle-missing", ("alpha", "{w}/nope", "--prompts", "{w}/p.jsonl"), 2, r"/nope: bundle directory not found", make=write("p.jsonl", GOOD_PROMPTS)
    ),
    Case("alpha-not-a-bundle", ("alpha", "{t}", "--prompts", "{w}/p.jsonl"), 2, r"target/manifest\.json: file not found", make=write("p.jsonl", GOOD_PROMPTS)),
    # the output is checked before the measurement (here on a dry-run bundle, which the measurement
    # itself would refuse: the output error coming first shows the order)
    Case(
        "alpha-out-under-a-file",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl", "-o", "{w}/f/report"),
        2,
        r"f/report: .*/f is not a directory",
        make=lambda c: (write("f", "x")(c), write("p.jsonl", GOOD_PROMPTS)(c)),
    ),
    Case("alpha-prompts-missing", ("alpha", "{b}", "--prompts", "{w}/none.jsonl"), 2, r"none\.jsonl: prompt file not found"),
    Case(
        "alpha-prompts-bad-json",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl"),
        2,
        r"p\.jsonl:2: not valid JSON",
        make=write("p.jsonl", GOOD_PROMPTS + "{oops\n"),
    ),
    Case(
        "alpha-prompts-no-turns",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl"),
        2,
        r'p\.jsonl:1: no "turns", "messages", "prompt" or "text"',
        make=write("p.jsonl", '{"question": "where is the text?"}\n'),
    ),
    Case("alpha-prompts-empty", ("alpha", "{b}", "--prompts", "{w}/p.jsonl"), 2, r"p\.jsonl: no prompts in the file", make=write("p.jsonl", "\n")),
    Case(
        "alpha-sa-threshold-zero",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl", "--modes", "chain,sa", "--sa-threshold", "0"),
        2,
        r"sa_config\.threshold: 0 is not a positive integer",
        make=write("p.jsonl", GOOD_PROMPTS),
    ),
    Case(
        "alpha-modes-unknown",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl", "--modes", "chain,tree"),
        2,
        r"--modes: unknown mode 'tree'",
        make=write("p.jsonl", GOOD_PROMPTS),
    ),
    Case(
        "alpha-modes-dynamic-tree-plus-sa",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl", "--modes", "chain,dynamic-tree+sa"),
        2,
        r"--modes: dynamic-tree\+sa: TensorRT-LLM's dynamic tree does not support the suffix-automaton enhancer",
        make=write("p.jsonl", GOOD_PROMPTS),
    ),
    Case(
        "alpha-dynamic-tree-topk-zero",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl", "--modes", "chain,dynamic-tree", "--dynamic-tree-topk", "0"),
        2,
        r"--dynamic-tree-topk: 0: the dynamic tree needs dynamic_tree_max_topK >= 1",
        make=write("p.jsonl", GOOD_PROMPTS),
    ),
    Case(
        "alpha-dynamic-tree-total-out-of-range",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl", "--modes", "dynamic-tree", "--dynamic-tree-topk", "2", "--max-total-draft-tokens", "100"),
        2,
        r"--max-total-draft-tokens: 100 must be in \[max_draft_len \(\d+\), dynamic_tree_max_topK \* max_draft_len \(\d+\)\]",
        make=write("p.jsonl", GOOD_PROMPTS),
    ),
    Case("alpha-prompts-not-utf8", ("alpha", "{b}", "--prompts", "{w}/p.txt"), 2, r"p\.txt: not UTF-8 text", make=write("p.txt", b"caf\xe9\n")),
    Case("alpha-sweep-backwards", ("alpha", "{b}", "--prompts", "{w}/p.jsonl", "--sweep", "5-2"), 2, r"--sweep: '5-2'", make=write("p.jsonl", GOOD_PROMPTS)),
    Case(
        "alpha-sweep-words",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl", "--sweep", "three"),
        2,
        r"--sweep: 'three' .* is not a draft length",
        make=write("p.jsonl", GOOD_PROMPTS),
    ),
    Case(
        "alpha-k-too-long",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl", "--max-draft-len", "17"),
        2,
        r"--max-draft-len: 17 \(hint: draft lengths are 1\.\.16\)",
        make=write("p.jsonl", GOOD_PROMPTS),
    ),
    Case(
        "alpha-sweep-with-generate",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl", "--sweep", "1-3", "--method", "generate"),
        2,
        r"--sweep: needs the estimator",
        make=write("p.jsonl", GOOD_PROMPTS),
    ),
    Case(
        "alpha-temperature-with-estimator",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl", "--temperature", "0.7"),
        2,
        r"--temperature: 0\.7 \(hint: use 0 \(greedy\), or a positive temperature with --method generate",
        make=write("p.jsonl", GOOD_PROMPTS),
    ),
    Case(
        "alpha-k-zero",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl", "--max-draft-len", "0"),
        2,
        r"--max-draft-len: 0 \(hint: draft lengths are 1\.\.16\)",
        make=write("p.jsonl", GOOD_PROMPTS),
    ),
    Case(
        "alpha-no-chat-template-option",
        ("alpha", "{w}/nope", "--prompts", "{w}/p.txt", "--no-chat-template"),
        2,
        r"/nope: bundle directory not found",
        make=write("p.txt", "def add(a, b):\n"),
    ),
    Case(
        "gate-threshold",
        ("gate", "{b}", "--prompts", "{w}/p.jsonl", "--threshold", "1.5"),
        2,
        r"--threshold: 1\.5 is not a probability",
        make=write("p.jsonl", GOOD_PROMPTS),
    ),
    # ---- captured traffic given to alpha --traffic / gate --against --traffic (issue 23 B, D)
    Case(
        "traffic-truncated-segment",
        ("alpha", "{b}", "--traffic", "{w}/cap"),
        2,
        r"cap/traffic-\d+-\d+-\d+\.jsonl: ends in the middle of a record \(truncated\)",
        make=_traffic(12, truncate=True),
    ),
    Case(
        "alpha-traffic-and-prompts",
        ("alpha", "{b}", "--prompts", "{w}/p.jsonl", "--traffic", "{w}/cap"),
        2,
        r"--traffic: does not go with --prompts",
        make=lambda c: (write("p.jsonl", GOOD_PROMPTS)(c), _traffic(3)(c)),
    ),
    Case(
        "gate-new-for-another-target",
        ("gate", "{w}/other", "--against", "{b}", "--traffic", "{w}/cap"),
        2,
        r"other: was built from another target than OLD .*sources\.target digests differ",
        make=_traffic(40, other_target=True),
    ),
    Case(
        "gate-too-little-heldout-traffic",
        ("gate", "{b}", "--against", "{b}", "--traffic", "{w}/cap"),
        2,
        r"cap: the held-back split has \d+ requests from \d+ distinct prompts \(of 12 requests, --holdout-fraction 0\.2\); the gate needs at least 20 distinct prompts",
        make=_traffic(12),
    ),
    Case(
        "gate-traffic-from-another-bundle",
        ("gate", "{b}", "--against", "{b}", "--traffic", "{w}/cap"),
        2,
        r"cap: 40 of 40 records were served by bundle ffffffffffff .*neither OLD .* nor NEW",
        make=_traffic(40, fingerprint="f" * 64),
    ),
    Case("gate-traffic-without-against", ("gate", "{b}", "--traffic", "{w}/cap"), 2, r"--against: missing", make=_traffic(3)),
    Case(
        "alpha-traffic-option-not-read",
        ("alpha", "{b}", "--traffic", "{w}/cap", "--limit", "3"),
        2,
        r"--limit: does not apply with --traffic",
        make=_traffic(3),
    ),
    Case(
        "gate-seed-contradicts-lineage",
        ("gate", "{w}/child", "--against", "{b}", "--traffic", "{w}/cap", "--seed", "3"),
        2,
        r"--seed: 3 differs from the 0 NEW's manifest lineage records for its held-back split \(hint: drop the option",
        make=_traffic(40, lineage=True),
    ),
    Case(
        "gate-lineage-without-split-sides",
        ("gate", "{w}/child", "--against", "{b}", "--traffic", "{w}/cap"),
        2,
        r"child/traffic_split\.json: is missing: NEW was retrained on traffic.*\(hint: retrain NEW",
        make=_traffic(40, lineage=True),
    ),
    Case("recommend-nothing-measured", ("recommend", "{b}"), 2, r"recommend: needs --report or --prompts"),
    Case("recommend-report-missing", ("recommend", "{b}", "--report", "{w}/none.json"), 2, r"none\.json: (report|file) not found"),
    # speculation knobs in the options file (TensorRT-LLM Eagle3DecodingConfig), refused when the bundle is opened
    Case(
        "options-schedule-k-rises",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config: .*K rises with batch size",
        make=_spec_options(lambda k: {"draft_len_schedule": {1: k, 4: 1, 8: 2}}),
    ),
    Case(
        "options-schedule-batch-zero",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config: .*keys are batch sizes, at least 1",
        make=_spec_options(lambda k: {"draft_len_schedule": {0: k, 4: 1}}),
    ),
    Case(
        "options-schedule-k0-guided",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:<root>: .*guided_decoding_backend 'xgrammar' the draft length must not reach 0 \(TensorRT-LLM #15022\)",
        make=_spec_options(lambda k: {"draft_len_schedule": {1: k, 4: 0}}, guided_decoding_backend="xgrammar"),
    ),
    Case(
        "options-acceptance-threshold-above-1",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config\.acceptance_rate_threshold: Input should be less than or equal to 1",
        make=_spec_options(lambda k: {"acceptance_rate_threshold": 1.5, "acceptance_rate_window_size": 16}),
    ),
    Case(
        "options-acceptance-threshold-without-window",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config: .*acceptance_rate_window_size and acceptance_rate_threshold go together",
        make=_spec_options(lambda k: {"acceptance_rate_threshold": 0.3}),
    ),
    # TensorRT-LLM's dynamic tree (speculative/dynamic_tree/builder.py): what its validators and worker refuse
    Case(
        "options-dynamic-tree-sliding-window-target",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config\.use_dynamic_tree: TensorRT-LLM's dynamic tree does not support this target: .*sliding-window",
        make=_dynamic_tree_options(target={"sliding_window": 32, "layer_types": ["sliding_attention", "full_attention"] * 4}),
    ),
    Case(
        "options-dynamic-tree-mla-target",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config\.use_dynamic_tree: .*MLA",
        make=_dynamic_tree_options(target={"kv_lora_rank": 512}),
    ),
    Case(
        "options-dynamic-tree-no-topk",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config: .*use_dynamic_tree needs dynamic_tree_max_topK",
        make=_dynamic_tree_options(dynamic_tree_max_topK=None),
    ),
    Case(
        "options-dynamic-tree-topk-zero",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config\.dynamic_tree_max_topK: Input should be greater than or equal to 1",
        make=_dynamic_tree_options(dynamic_tree_max_topK=0),
    ),
    Case(
        "options-dynamic-tree-total-above-topk-times-k",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config: .*max_total_draft_tokens 999 must be in \[max_draft_len \d+, dynamic_tree_max_topK \* max_draft_len \d+\]",
        make=_dynamic_tree_options(max_total_draft_tokens=999),
    ),
    Case(
        "options-dynamic-tree-with-sa",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config: .*use_dynamic_tree does not go with sa_config",
        make=_dynamic_tree_options(sa_config={"threshold": 4}),
    ),
    Case(
        "options-dynamic-tree-stepped-schedule",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config: .*with use_dynamic_tree, draft_len_schedule may only switch speculation off",
        make=_spec_options(lambda k: {"use_dynamic_tree": True, "dynamic_tree_max_topK": 4, "draft_len_schedule": {1: k, 4: 1}}),
    ),
    Case(
        "options-topk-without-dynamic-tree",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config: .*dynamic_tree_max_topK / max_total_draft_tokens need use_dynamic_tree: true",
        make=_spec_options(lambda k: {"dynamic_tree_max_topK": 4}),
    ),
    # speculative sampling flags (core/spec_sampling.py)
    Case(
        "options-advanced-sampling-mode-unknown",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config\.advanced_sampling_mode: Input should be 'full', 'no_topk', 'no_topp' or 'no_topk_no_topp'",
        make=_spec_options(lambda k: {"allow_advanced_sampling": True, "advanced_sampling_mode": "no_top_k"}),
    ),
    Case(
        "options-rejection-sampling-without-advanced-sampling",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config: .*use_rejection_sampling needs allow_advanced_sampling: true",
        make=_spec_options(lambda k: {"use_rejection_sampling": True, "allow_advanced_sampling": False}),
    ),
    # suffix automaton, spec_dec_variant, eagle3_model_arch, and what a TensorRT-LLM release lacks
    # (compile --check-only --trtllm-version: the options as that release loads them; issue 22)
    Case(
        "options-sa-threshold-zero",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config\.sa_config\.threshold: Input should be greater than or equal to 1",
        make=_spec_options(lambda k: {"sa_config": {"threshold": 0}}),
    ),
    Case(
        "options-spec-dec-variant-zero",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config\.spec_dec_variant: Input should be greater than 0",
        make=_spec_options(lambda k: {"spec_dec_variant": 0}),
    ),
    Case(
        "options-spec-dec-variant-unknown",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config\.spec_dec_variant: Input should be a valid integer",
        make=_spec_options(lambda k: {"spec_dec_variant": "tree"}),
    ),
    Case(
        "options-eagle3-model-arch-unknown",
        ("recommend", "{w}/out"),
        2,
        r"llm_api_options\.yaml:speculative_config\.eagle3_model_arch: Input should be 'llama3' or 'mistral_large3'",
        make=_spec_options(lambda k: {"eagle3_model_arch": "qwen3"}),
    ),
    Case(
        "release-lacks-eagle3-model-arch",
        ("compile", "{w}/out", "--check-only", "--trtllm-version", "1.2.1"),
        2,
        r"llm_api_options\.yaml:speculative_config\.eagle3_model_arch: TensorRT-LLM 1\.2\.1 has no eagle3_model_arch .*hint: deploy to TensorRT-LLM 1\.3",
        make=_spec_options(lambda k: {"eagle3_model_arch": "mistral_large3"}),
    ),
    Case(
        "release-lacks-sa-config",
        ("compile", "{w}/out", "--check-only", "--trtllm-version", "1.2.1"),
        2,
        r"speculative_config\.sa_config: TensorRT-LLM 1\.2\.1 has no suffix-automaton enhancer",
        make=_spec_options(lambda k: {"sa_config": {"threshold": 4}}),
    ),
    Case(
        "release-lacks-spec-dec-variant",  # served with the release's default: left out, with a note naming the release
        ("compile", "{w}/out", "--check-only", "--trtllm-version", "1.3.0rc27"),
        0,
        r"note: TensorRT-LLM 1\.3\.0rc27: spec_dec_variant: 5 left out",
        make=_spec_options(lambda k: {"spec_dec_variant": 5}),
    ),
    Case(
        "release-schedule-without-batch-1",  # 1.2 wants batch size 1 in the schedule: translated (keys become lower bounds), with a note
        ("compile", "{w}/out", "--check-only", "--trtllm-version", "1.2.1"),
        0,
        r"note: TensorRT-LLM 1\.2\.1: max_concurrency / draft_len_schedule load but do not switch speculation off",
        make=_spec_options(lambda k: {"draft_len_schedule": {4: k, 8: 1}}),
    ),
    Case(
        "release-version-not-a-version",
        ("compile", "{w}/out", "--check-only", "--trtllm-version", "latest"),
        2,
        r"TensorRT-LLM version: cannot parse version 'latest'",
        make=_spec_options(),
    ),
    Case(
        "release-version-without-check-only",
        ("compile", "{w}/out", "--trtllm-version", "1.2.1"),
        2,
        r"--trtllm-version: 1\.2\.1 \(hint: only with --check-only",
        make=_spec_options(),
    ),
    Case(
        "recommend-report-not-json",
        ("recommend", "{b}", "--report", "{w}/report.json"),
        2,
        r"report\.json: not valid JSON",
        make=write("report.json", "{not json"),
    ),
    Case(
        "recommend-report-not-alpha",
        ("recommend", "{b}", "--report", "{w}/report.json"),
        2,
        r"report\.json: not an alpha report",
        make=lambda c: _report(c, {"pairs": {}}),
    ),
    Case(
        "recommend-dry-run-bundle",
        ("recommend", "{b}", "--report", "{w}/report.json"),
        2,
        r"dry: no weight files in target/ or draft/",
        make=lambda c: _report(c, _alpha_report_json([0.8, 0.6, 0.4])),
    ),
    Case("package-bad-name", ("package", "{b}", "-o", "{out}", "--name", "no spaces!"), 2, r"--name: 'no spaces!' is not a valid Triton model name"),
    Case("package-zero-instances", ("package", "{b}", "-o", "{out}", "--instances", "0"), 2, r"--instances: must be >= 1"),
    Case(
        "package-over-a-non-repository",
        ("package", "{b}", "-o", "{w}/keep", "--force"),
        2,
        r"keep: exists and is not a model repository",
        make=write("keep/precious.txt", "mine"),
    ),
    Case(
        "package-over-an-edited-model",
        ("package", "{b}", "-o", "{w}/repo"),
        2,
        r"repo/eagle3/1/model\.yaml: differs from what `eagle3-trt package` wrote; nothing written \(hint: .*--force overwrites only the models package writes",
        make=_packaged_then_edited,
    ),
    Case(
        "package-over-a-model-not-ours",
        ("package", "{b}", "-o", "{w}/repo"),
        2,
        r"repo/eagle3: a model `eagle3-trt package` did not write \(no eagle3-package\.json\); nothing written \(hint: pass another --name",
        make=write("repo/eagle3/config.pbtxt", 'name: "eagle3"\nbackend: "python"\n'),
    ),
    Case("serve-no-repository", ("serve", "{w}/nope"), 2, r"nope: model repository not found"),
    # ---- issue 23 A: traffic capture settings, refused before any server starts
    Case(
        "serve-capture-not-a-directory",
        ("serve", "{w}/nope", "--capture", "{w}/afile"),
        2,
        r"^error: \S+/afile: is not a directory \(hint: --capture takes a directory this user can write",
        make=write("afile", "x"),
    ),
    Case(
        "serve-capture-read-only",
        ("serve", "{w}/nope", "--capture", "{w}/ro/cap"),
        2,
        r"^error: \S+/ro/cap: not writable: \S+/ro is on a read-only file system \(hint: --capture takes a directory",
        around="rofs",
        root_only=True,
    ),
    Case(
        "serve-capture-bad-regex",
        ("serve", "{w}/nope", "--capture", "{w}/cap", "--capture-redact", "sk-(\\w+"),
        2,
        r"^error: --capture-redact: 'sk-\(\\\\w\+' is not a regular expression \(missing \), unterminated subpattern",
    ),
    Case(
        "serve-capture-redact-alone",
        ("serve", "{w}/nope", "--capture-redact", "sk-\\w+"),
        2,
        r"^error: --capture-redact: given without --capture \(hint: add --capture DIR",
    ),
    Case(
        "serve-dynamo-capture-under-a-file",
        ("serve-dynamo", "{b}", "--capture", "{w}/afile/cap"),
        2,
        r"^error: \S+/afile/cap: cannot be created: \S+/afile is not a directory",
        make=write("afile", "x"),
    ),
    # ---- issue 30: redaction that cannot leak, retention, a deleted capture directory
    Case(
        "serve-capture-redact-matches-empty",
        ("serve", "{w}/nope", "--capture", "{w}/cap", "--capture-redact", "\\d*"),
        2,
        r"^error: --capture-redact: '\\\\d\*' matches the empty string",
    ),
    Case(
        "serve-capture-keep-mb-at-the-cap",
        ("serve", "{w}/nope", "--capture", "{w}/cap", "--capture-max-mb", "100", "--capture-keep-mb", "100"),
        2,
        r"^error: --capture-keep-mb: 100 is not below --capture-max-mb 100: the cap would stop capture before retention deletes anything",
    ),
    Case(
        "serve-dynamo-capture-keep-hours-zero",
        ("serve-dynamo", "{b}", "--capture", "{w}/cap", "--capture-keep-hours", "0"),
        2,
        r"^error: --capture-keep-hours: 0: must be a number more than 0",
    ),
    Case(
        "serve-dynamo-capture-segment-s-zero",
        ("serve-dynamo", "{b}", "--capture", "{w}/cap", "--capture-segment-s", "0"),
        2,
        r"^error: --capture-segment-s: 0: must be a number of seconds in \(0, 86400\]",
    ),
    Case(
        "serve-capture-keep-hours-alone",
        ("serve", "{w}/nope", "--capture-keep-hours", "24"),
        2,
        r"^error: --capture-keep-hours: given without --capture \(hint: add --capture DIR",
    ),
    Case(
        "alpha-traffic-deleted-directory",
        ("alpha", "{b}", "--traffic", "{w}/cap"),
        2,
        r"^error: \S+/cap: is not a directory \(hint: pass the directory given to serve --capture\)",
        make=lambda c: (_traffic(3)(c), shutil.rmtree(c.w / "cap")),
    ),
    # ---- issue 23 E: deploy a new head into a served repository
    Case(
        "deploy-head-for-another-target",
        ("deploy", "{w}/other", "--repo", "{w}/repo", "--state-dir", "{w}/state"),
        2,
        r"^error: \S+/other: built for another target \(someone/other-target\) than version 1 of 'eagle3' serves \(\S+\) "
        r"\(hint: deploy a head built for the served target",
        make=_deploy_other_target,
    ),
    Case(
        "deploy-to-a-repository-not-ours",
        ("deploy", "{b}", "--repo", "{w}/repo", "--state-dir", "{w}/state"),
        2,
        r"^error: \S+/repo/eagle3: a model `eagle3-trt package` did not write \(no eagle3-package\.json\); deploy adds versions only to the "
        r"toolkit's own models \(hint: package the first version",
        make=write("repo/eagle3/config.pbtxt", 'name: "eagle3"\nbackend: "python"\n'),
    ),
    Case(
        "deploy-with-no-server",
        ("deploy", "{b}", "--repo", "{w}/repo", "--state-dir", "{w}/state"),
        2,
        r"^error: \S+/state/server\.json: no server running for \S+/repo \(hint: start it with `eagle3-trt serve \S+/repo --state-dir \S+/state`, "
        r"or pass --offline",
        make=_packaged,
    ),
    Case(
        "deploy-dynamo-with-no-deployment",
        ("deploy-dynamo", "{b}", "--state-dir", "{w}/dstate"),
        2,
        r"^error: \S+/dstate/state\.json: no Dynamo deployment running here \(hint: start one with `eagle3-trt serve-dynamo BUNDLE --state-dir \S+/dstate`",
    ),
    # ---- issue 21 E: newcomer mistakes (a misspelled preset, option or command, a path that is not
    # there, a second server): one line with the fix, before any work, no usage dump
    Case(
        "model-unknown-suggests-closest",
        ("engine", "--model", "llama-70b", "-o", "{out}"),
        2,
        r"^error: MODEL: unknown preset 'llama-70b' .*\(hint: did you mean 'llama3\.3-70b'\? available presets: gpt-oss-120b, .*tiny-qwen3;",
    ),
    Case("model-unknown-no-close-name", ("engine", "--model", "nope", "-o", "{out}"), 2, r"unknown preset 'nope' .*\(hint: available presets: gpt-oss-120b, "),
    Case("plan-model-unknown", ("plan", "llama-70b"), 2, r"MODEL: unknown preset 'llama-70b' .*did you mean 'llama3\.3-70b'\?"),
    Case(
        "option-misspelled",
        ("engine", "--modle", "tiny"),
        2,
        r"^error: eagle3-trt engine: no such option --modle \(hint: did you mean --model\? `eagle3-trt engine --help` lists the options\)$",
        absent=("Usage:",),
    ),
    Case(
        "option-misspelled-alpha",
        ("alpha", "{b}", "--promts", "x"),
        2,
        r"^error: eagle3-trt alpha: no such option --promts \(hint: did you mean --prompts\? ",
        absent=("Usage:",),
    ),
    Case(
        "option-unknown-no-close-name",
        ("engine", "--zzzz"),
        2,
        r"^error: eagle3-trt engine: no such option --zzzz \(hint: `eagle3-trt engine --help`",
        absent=("Usage:",),
    ),
    Case(
        "command-misspelled",
        ("engin",),
        2,
        r"^error: eagle3-trt: no such command 'engin' \(hint: did you mean engine\? `eagle3-trt --help` lists the commands\)$",
        absent=("Usage:",),
    ),
    # serve is loaded lazily (cli.LAZY_COMMANDS): it is a suggestion all the same
    Case("command-misspelled-lazy", ("serv", "{w}"), 2, r"no such command 'serv' \(hint: did you mean serve\? ", absent=("Usage:",)),
    Case(
        "option-bad-choice", ("engine", "--quant", "fp9"), 2, r"^error: eagle3-trt engine: Invalid value for '--quant': 'fp9' is not one of", absent=("Usage:",)
    ),
    Case("argument-missing", ("alpha",), 2, r"^error: eagle3-trt alpha: Missing argument 'BUNDLE'", absent=("Usage:",)),
    Case(
        "engine-target-not-there",
        ("engine", "--target", "{w}/nope", "--draft", "{d}", "-o", "{out}"),
        2,
        r"^error: --target \S+/w/nope: directory does not exist \(hint: pass an existing local checkpoint directory; make takes it as TARGET=DIR\)$",
    ),
    Case(
        "engine-draft-not-there",
        ("engine", "--target", "{t}", "--draft", "{w}/nope", "-o", "{out}"),
        2,
        r"^error: --draft \S+/w/nope: directory does not exist",
    ),
    Case(
        "engine-draft-is-a-file",
        ("engine", "--target", "{t}", "--draft", "{d}/config.json", "-o", "{out}"),
        2,
        r"^error: --draft \S+/config\.json: is not a directory",
    ),
    Case("validate-draft-not-there", ("validate", "--target", "{t}", "--draft", "{w}/nope"), 2, r"^error: --draft \S+/w/nope: directory does not exist"),
    Case(
        "train-draft-target-not-there",
        ("train-draft", "--target", "{w}/nope", "--data", "{w}/p.jsonl", "-o", "{out}"),
        2,
        r"^error: eagle3-trt train-draft: Invalid value for '--target': Directory '\S+/w/nope' does not exist",
        make=write("p.jsonl", GOOD_PROMPTS),
        absent=("Usage:",),
    ),
    Case(
        "serve-while-running",
        ("serve", "{w}/repo", "--state-dir", "{w}/state"),
        2,
        r"^error: \S+/state/server\.json: a server is already running here: tritonserver pid \d+, HTTP 18000, gRPC 18001, metrics 18002 "
        r"on 127\.0\.0\.1, repository \S+/repo \(hint: stop it with `eagle3-trt stop --state-dir \S+/state`, or pass another --state-dir",
        make=_triton_running,
        absent=("starting tritonserver",),  # refused before it says it starts one
    ),
    Case(
        "serve-dynamo-while-running",
        ("serve-dynamo", "{b}", "--state-dir", "{w}/dstate"),
        2,
        r"^error: \S+/dstate: a Dynamo deployment is already running from this state directory \(http://127\.0\.0\.1:18080/v1; "
        r"frontend pid \d+ port 18080; bundle \S+\) \(hint: stop it first: eagle3-trt stop-dynamo --state-dir \S+/dstate, ",
        make=_dynamo_running,
    ),
    # ---- gpt-oss as openai ships it (experts in MXFP4): a copy of the embedded tiny-gpt-oss pair in {w}/go
    Case(
        "mxfp4-scales-missing",
        GV,
        2,
        r"go/target: model\.layers\.7\.mlp\.experts\.down_proj_scales missing: a gpt-oss decoder "
        r"layer has it \(mxfp4 checkpoints ship it\)",
        make=_gpt_oss(lambda sd: sd.pop("model.layers.7.mlp.experts.down_proj_scales")),
    ),
    Case(
        "mxfp4-scales-not-uint8",
        GV,
        2,
        r"go/target:model\.layers\.0\.mlp\.experts\.gate_up_proj_scales: dtype float32, mxfp4 ships uint8",
        make=_gpt_oss(lambda sd: sd.update({"model.layers.0.mlp.experts.gate_up_proj_scales": sd["model.layers.0.mlp.experts.gate_up_proj_scales"].float()})),
    ),
    Case(
        "mxfp4-blocks-of-another-width",
        GV,
        2,
        r"go/target:model\.layers\.3\.mlp\.experts\.down_proj_blocks: shape \(4, 128, 3, 16\), "
        r"config\.json implies \(4, 128, 4, 16\)",
        make=_gpt_oss(
            lambda sd: sd.update({"model.layers.3.mlp.experts.down_proj_blocks": sd["model.layers.3.mlp.experts.down_proj_blocks"][:, :, :3].contiguous()})
        ),
    ),
    Case(
        "mxfp4-target-fp8",
        ("engine", "--target", "{w}/go/target", "--draft", "{w}/go/draft", "--quant", "fp8", "-o", "{out}"),
        2,
        r"--quant: fp8 on a target that ships MXFP4 weights .*hint: use --quant native",
        make=_gpt_oss(),
    ),
    Case(
        "mxfp4-native-fp8-kv",
        ("engine", "--model", "tiny-gpt-oss", "--kv-cache", "fp8", "-o", "{out}"),
        2,
        r"--kv-cache: fp8 with --quant native: an FP8 KV cache needs calibrated k/v scales",
    ),
    Case(
        "mxfp4-llama-head",
        ("validate", "--target", "{w}/go/target", "--draft", "{d}"),
        2,
        r"draft/config\.json:vocab_size: draft was trained for a vocabulary of 512, target has 1024",
        make=_gpt_oss(),
    ),
    # ---- what files cannot show (convert/behaviour.py): the pair is run on the calibration prompts
    Case(
        "tokenizer-vocab-permuted-deep",
        ("validate", "--deep", "--target", "{w}/bt/target", "--draft", "{w}/bt/draft"),
        2,
        r"bt/target/tokenizer\.json: the target's next-token loss on \d+ calibration prompts is [\d.]+ nats, 1\.\d\d of log V = 7\.62 .*"
        r"is the tokenizer the model's own\?",
        make=_behaviour_case("tiny", permuted=True),
    ),
    Case(
        "draft-for-another-target-deep",
        ("validate", "--deep", "--target", "{w}/bt/target", "--draft", "{w}/bt/draft"),
        2,
        r"bt/draft: the draft's top-1 agreement with the target's next token on \d+ calibration prompts is 0\.\d+, [\d.]+x chance \(1/512 .*"
        r"was this head trained for this target\?",
        make=_behaviour_case("tiny-qwen3", draft_from="tiny-gpt-oss"),
    ),
]


# ---------------------------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------------------------
PWNED = Path("/tmp/eagle3-trt-bad-inputs-pwned")


def _snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under root (dot-files included): type, size, mtime."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        # a directory's mtime moves when an entry is created and removed again: its entries are what count
        out[str(p.relative_to(root))] = (st.st_mode >> 12, st.st_size, st.st_mtime_ns) if p.is_file() else (st.st_mode >> 12, 0, 0)
    return out


@contextmanager
def _around(case: Case, ctx: Ctx):
    if case.around == "lock":
        # another build holds the output: the test enters the atomic writer of the same destination
        try:
            with staged_dir(ctx.w / "out"):
                yield
                raise _Abandon()  # leave nothing: the staging directory and the lock go with the exception
        except _Abandon:
            pass
    elif case.around == "rofs":  # a read-only file system at {w}/ro (unwritable even for root)
        mnt = ctx.w / "ro"
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(mnt)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr  # root_only cases carry needs("tmpfs")
        try:
            yield
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=True)
    elif case.around == "tmpfs":
        mnt = ctx.w / "small"
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(mnt)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr  # root_only cases carry needs("tmpfs")
        try:
            yield
            assert list(mnt.iterdir()) == [], "a full disk left files behind"
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=True)
    else:
        yield


class _Abandon(Exception):
    pass


def _param(c: Case):
    marks = [pytest.mark.xfail(strict=True, reason=f"pending: {c.pending}")] if c.pending else []
    marks += [pytest.mark.needs("tmpfs")] if c.root_only else []
    return pytest.param(c, id=c.id, marks=marks)


def _run_case(case: Case, cli, pair, bundle: Path, tmp_path: Path) -> Result:
    w = tmp_path / "w"
    w.mkdir(parents=True)
    ctx = Ctx(w, w / "target", w / "draft", bundle)
    shutil.copytree(pair[0], ctx.t)
    shutil.copytree(pair[1], ctx.d)
    if case.make:
        case.make(ctx)
    f = ctx.fmt()
    if case.model_arg:
        f["model"] = case.model_arg(ctx)
    argv = [a.format(**f) for a in case.argv]
    with _around(case, ctx):
        before = _snapshot(w), _snapshot(bundle.parent)
        res = cli(argv, w)
        after = _snapshot(w), _snapshot(bundle.parent)
    said = f"exit {res.rc}\n--- stdout\n{res.out[-3000:]}\n--- stderr\n{res.err[-3000:]}"
    assert "Traceback" not in res.err + res.out, said
    assert res.rc == case.rc, said
    if case.rc == 0:
        assert re.search(case.pattern, res.out + res.err), said
    else:
        # "error: " from a UserError and from a command-line mistake (cli._usage_line); "Error: " is click's own format
        errors = [ln for ln in res.err.splitlines() if ln.startswith(("error: ", "Error: "))]
        assert len(errors) == 1 and res.last_err_line == errors[0], said  # one line, the last thing printed
        assert re.search(case.pattern, errors[0]), f"pattern {case.pattern!r} not in:\n{errors[0]}"
    for text in case.absent:
        assert text not in res.err, said

    # nothing left behind: no bundle, staging directory, lock file, report or cache in the case's
    # directory (its cwd), and the shared bundle untouched
    def kept(snap: dict) -> dict:
        return {k: v for k, v in snap.items() if not (case.changes and k.startswith(case.changes))}

    assert kept(after[0]) == kept(before[0]), f"left behind or changed: {sorted(set(after[0].items()) ^ set(before[0].items()))}"
    assert not any(p.name.startswith(".") for p in w.iterdir()), "a staging directory or lock file is left"
    if case.check:
        case.check(ctx)
    assert after[1] == before[1], "the shared bundle changed"
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())
    return res


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_input(case, cli, pair, dry_bundle, tmp_path):
    _run_case(case, cli, pair, dry_bundle, tmp_path)
    assert not PWNED.exists(), "a pickle ran code"


def test_corpus_is_complete():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 40
    # every command that takes user files is exercised
    assert {c.argv[0] for c in CASES} >= {"validate", "engine", "alpha", "gate", "recommend", "package", "serve"}


FRESH_IDS = ("target-config-truncated", "nvfp4-on-hopper", "d2t-not-injective")


@pytest.mark.parametrize("case_id", FRESH_IDS)
def test_fork_and_fresh_process_agree(case_id, cli, pair, dry_bundle, tmp_path):
    """The same case through the installed console script (or python -m eagle3_trt.cli) in a new
    interpreter: the same exit code and the same line as the forked run."""
    case = next(c for c in CASES if c.id == case_id)
    forked = _run_case(case, cli, pair, dry_bundle, tmp_path / "forked")
    script = Path(sys.executable).with_name("eagle3-trt")

    def fresh(argv, cwd):
        cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "eagle3_trt.cli"]
        p = subprocess.run([*cmd, *argv], cwd=cwd, capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
        return Result(p.returncode, p.stdout, p.stderr)

    new = _run_case(case, fresh, pair, dry_bundle, tmp_path / "fresh")
    strip = lambda s: s.replace(str(tmp_path / "forked"), "").replace(str(tmp_path / "fresh"), "")  # noqa: E731
    assert (new.rc, strip(new.last_err_line)) == (forked.rc, strip(forked.last_err_line))
