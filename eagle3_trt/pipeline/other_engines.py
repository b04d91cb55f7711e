"""Launch the same bundle (quantized target + EAGLE-3 draft) with vLLM, SGLang or trtllm-serve.

``launcher_files(options, ...)`` renders ``launch/{vllm,sglang,trtllm-serve}.sh`` (+ README.md and
the trtllm-serve options file) from a bundle's options and weight formats; ``build/bundle.py``
writes them into the bundle (and rewrites them whenever the options change), so one quantized
pair can be compared across engines. Scripts find the bundle from their own location, so the bundle can be moved; every
option they pass is checked against the option names each engine documents (tables below),
and the tests check that no other name appears.

Sources of the option names:
- vLLM: ``vllm serve`` engine arguments (``vllm/engine/arg_utils.py``) and ``SpeculativeConfig``
  (``vllm/config/speculative.py``: method "eagle3", model, num_speculative_tokens,
  draft_tensor_parallel_size); EAGLE-3 docs ``docs/features/speculative_decoding/eagle``.
- SGLang: ``python -m sglang.launch_server`` server arguments (``python/sglang/srt/server_args.py``),
  speculative-decoding docs (``--speculative-algorithm EAGLE3``, ``--speculative-draft-model-path``,
  ``--speculative-num-steps``, ``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``).
- trtllm-serve: ``tensorrt_llm/commands/serve.py`` (``--extra_llm_api_options`` YAML).

Methods with their own head format (speculative/registry.py ``method_for_head``): the bundle's options
select the method (``registry.method_from_options``: the key its ``head.speculative_options`` wrote) and
the method's ``head.serving`` table says which engine serves it and how (each home's serving module
cites the engine's source): ``launch/`` then holds only those engines' scripts, and its README says why
the others are left out.

Paths. Every script passes absolute paths, found at launch from the script's own location. For
trtllm-serve that matters beyond convenience: under ``trtllm-llmapi-launch`` (several nodes) only
rank 0 runs the command; the other ranks run ``python3 -m tensorrt_llm.llmapi.mgmn_worker_node``
in their own working directory and load the model from the arguments rank 0 sends them, so a
path relative to the bundle would not resolve there (NVIDIA/TensorRT-LLM
tensorrt_llm/llmapi/trtllm-llmapi-launch at 020c89e6). The script therefore writes the options
file with absolute paths to a temporary file at each launch. That launcher also runs its command
unquoted (``$task_with_command``), so the path to the script must not contain spaces there.

Releases. ``launch/trtllm-serve.yaml`` is for TensorRT-LLM 1.3 and newer and
``launch/trtllm-serve-1.2.yaml`` for 1.2.x (``build/trtllm_versions.py`` has the table and its
sources); the script picks one from the installed version (``TRTLLM_VERSION`` overrides).

Context length. vLLM and SGLang run the draft with its own ``max_position_embeddings``: vLLM
hits a device-side assert past it when ``--max-model-len`` is larger (vllm-project/vllm issue
#48894), and SGLang refuses a longer ``--context-length`` unless
SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set (sgl-project/sglang PR #9388; PR #10787 raises
the draft's limit to the target's in newer releases). Their scripts pass the smaller of the
bundle's max_seq_len and the draft's max_position_embeddings.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

import yaml

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline import trtllm_adapter as adapter
from eagle3_trt.pipeline import trtllm_versions as versions
from eagle3_trt.pipeline.llm_options import VLLM_ONLY_FIELDS, LlmApiOptions
from eagle3_trt.speculative.dynamic_tree.release import drop_dynamic_tree_for_launch
from eagle3_trt.speculative.eagle3.release import variant_for_release
from eagle3_trt.speculative.eagle3.sampling_release import sampling_for_release
from eagle3_trt.speculative.registry import method_from_options
from eagle3_trt.speculative.sa.release import drop_sa_for_launch

LAUNCH_DIR = "launch"
TRTLLM_SERVE_YAML = "trtllm-serve.yaml"
# One options file per release band (build/trtllm_versions.LAUNCH_BANDS); the last is the default.
TRTLLM_SERVE_YAMLS = {band: (TRTLLM_SERVE_YAML if band == "current" else f"trtllm-serve-{band}.yaml") for band, _, _ in versions.LAUNCH_BANDS}
# Options-file keys holding bundle-relative paths, as yaml.safe_dump writes them (the script
# makes them absolute with sed, so their values must be plain relative paths).
_PATH_LINES = ("tokenizer: ", "  speculative_model_dir: ")
_PLAIN_RELATIVE = re.compile(r"[A-Za-z0-9._-][A-Za-z0-9._/-]*")

VLLM_SERVE_OPTIONS = frozenset(
    {
        "--tokenizer",
        "--speculative-config",
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--max-model-len",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--gpu-memory-utilization",
        "--kv-cache-dtype",
        "--enable-chunked-prefill",
        "--trust-remote-code",
        "--served-model-name",
        "--host",
        "--port",
        "--dtype",
        "--quantization",
        "--seed",
        "--generation-config",
    }
)
# vLLM's SpeculativeConfig keys, and the bundle options' vLLM-only speculative keys (llm_options.VLLM_ONLY_FIELDS,
# also vllm/config/speculative.py's), which a method's serving hook may write into vLLM's config
VLLM_SPECULATIVE_KEYS = (
    frozenset(
        {
            "method",
            "model",
            "num_speculative_tokens",
            "draft_tensor_parallel_size",
            "quantization",
            "max_model_len",
            "revision",
            "code_revision",
        }
    )
    | VLLM_ONLY_FIELDS
)
VLLM_KV_DTYPES = frozenset({"auto", "fp8", "fp8_e4m3", "fp8_e5m2"})

SGLANG_OPTIONS = frozenset(
    {
        "--model-path",
        "--tokenizer-path",
        "--speculative-algorithm",
        "--speculative-draft-model-path",
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-num-draft-tokens",
        "--tp-size",
        "--dp-size",
        "--context-length",
        "--max-running-requests",
        "--cuda-graph-max-bs",
        "--mem-fraction-static",
        "--kv-cache-dtype",
        "--chunked-prefill-size",
        "--host",
        "--port",
        "--served-model-name",
        "--trust-remote-code",
        "--quantization",
        "--dtype",
    }
)
SGLANG_KV_DTYPES = frozenset({"auto", "fp8_e4m3", "fp8_e5m2"})

TRTLLM_SERVE_OPTIONS = frozenset(
    {
        "--host",
        "--port",
        "--backend",
        "--tokenizer",
        "--tp_size",
        "--pp_size",
        "--max_batch_size",
        "--max_num_tokens",
        "--max_seq_len",
        "--kv_cache_free_gpu_memory_fraction",
        "--extra_llm_api_options",
        "--trust_remote_code",
        "--log_level",
        "--num_postprocess_workers",
    }
)

# The bundle's KV-cache format in each engine's spelling ("auto" keeps the checkpoint's).
_KV = {"vllm": {"fp8": "fp8", "auto": "auto"}, "sglang": {"fp8": "fp8_e4m3", "auto": "auto"}}


@dataclass(frozen=True)
class BundleFacts:
    """What the launchers need from a bundle: its options and weight formats."""

    max_draft_len: int
    tensor_parallel_size: int
    max_seq_len: int | None
    max_batch_size: int
    max_num_tokens: int
    cuda_graph_max_batch: int | None
    kv_cache: str  # fp8 | auto
    quant: dict
    max_concurrency: int | None
    draft_max_positions: int | None = None  # the draft config's max_position_embeddings
    # a method with its own head: its head hooks' serving table (engine -> vLLM config, or served false + why)
    serving: dict | None = None
    method: str | None = None

    @property
    def context_len(self) -> int | None:
        """The context length to give vLLM / SGLang: max_seq_len, capped by the draft's positions."""
        known = [n for n in (self.max_seq_len, self.draft_max_positions) if n]
        return min(known) if known else None


def bundle_facts(opts: LlmApiOptions, *, target_format: str, draft_format: str, draft_max_positions: int | None = None) -> BundleFacts:
    """The facts of a bundle opened with ``build/bundle.open_bundle`` (its options, its manifest's
    formats, its draft config's max_position_embeddings)."""
    kv = opts.kv_cache_config.dtype
    if kv not in ("fp8", "auto"):
        raise UserError(
            f"{adapter.OPTIONS_FILE}:kv_cache_config.dtype", f"KV cache {kv!r} has no vLLM/SGLang equivalent here", "rebuild with --kv-cache fp8 or auto"
        )
    spec = opts.speculative_config
    mc = spec.max_concurrency
    if mc is None and spec.draft_len_schedule:
        # the bundle's form (TensorRT-LLM 1.3+, PR #10860): keys are upper bounds, K is 0 above the
        # largest key, and K never rises with batch (schema), so speculation stops after the last key with K > 0
        speculating = [b for b, k in spec.draft_len_schedule.items() if k > 0]
        mc = max(speculating) if speculating else None
    return BundleFacts(
        max_draft_len=spec.max_draft_len,
        tensor_parallel_size=opts.tensor_parallel_size,
        max_seq_len=opts.max_seq_len,
        max_batch_size=opts.max_batch_size,
        max_num_tokens=opts.max_num_tokens,
        cuda_graph_max_batch=(opts.cuda_graph_config.max_batch_size or max(opts.cuda_graph_config.batch_sizes or [0]) or None)
        if opts.cuda_graph_config
        else None,
        kv_cache=kv,
        quant={"target": target_format, "draft": draft_format, "kv_cache": kv},
        max_concurrency=mc,
        draft_max_positions=draft_max_positions,
        **_method_serving(opts),
    )


def _method_serving(opts: LlmApiOptions) -> dict:
    """The serving table of the method the options select when it has its own head format, else nothing."""
    method = method_from_options(opts.speculative_config)
    hooks = getattr(type(method), "head", None)
    if hooks is None or method is None:
        return {}
    return {"serving": hooks.serving(f"{BUNDLE_VAR}/draft", opts.speculative_config.max_draft_len), "method": method.name}


def refuse_on_trtllm(bundle_dir: object, opts: LlmApiOptions, what: str) -> None:
    """One-line UserError when ``what`` (compile, Triton) would run the bundle's method on TensorRT-LLM and no
    release serves it (its head hooks' ``trtllm_refusal``), naming the options field that selects the method."""
    why = trtllm_refusal(opts)
    if why is not None:
        raise UserError(f"{bundle_dir}/{adapter.OPTIONS_FILE}:speculative_config", f"{what}: {why}", "serve this bundle with its launch/vllm.sh (vLLM)")


def trtllm_refusal(opts: LlmApiOptions) -> str | None:
    """Why TensorRT-LLM cannot serve the bundle's method (None: it can): compile, Triton and Dynamo ask here."""
    method = method_from_options(opts.speculative_config)
    hooks = getattr(type(method), "head", None)
    return None if hooks is None else str(hooks.trtllm_refusal)


# ---------------------------------------------------------------------------------------------
# Argument lists. "$BUNDLE" is a shell variable set by the script from its own location.

BUNDLE_VAR = "$BUNDLE"


def vllm_args(f: BundleFacts) -> tuple[list[str], dict]:
    """``vllm serve`` arguments after the model path, and the --speculative-config dict."""
    spec = {"method": "eagle3", "model": f"{BUNDLE_VAR}/draft", "num_speculative_tokens": f.max_draft_len}
    if f.serving is not None:  # the method's own vLLM config (its head hooks' serving table)
        spec = dict(f.serving["vllm"])
    args = [
        "--tokenizer",
        f"{BUNDLE_VAR}/tokenizer",
        "--speculative-config",
        "__SPEC_JSON__",
        "--tensor-parallel-size",
        str(f.tensor_parallel_size),
        "--max-num-seqs",
        str(f.max_batch_size),
        "--max-num-batched-tokens",
        str(f.max_num_tokens),
        "--kv-cache-dtype",
        _KV["vllm"][f.kv_cache],
    ]
    if f.context_len:
        args += ["--max-model-len", str(f.context_len)]
    return args, spec


def sglang_args(f: BundleFacts) -> list[str]:
    """``python -m sglang.launch_server`` arguments. A linear EAGLE-3 chain of K tokens is
    K steps of top-1 drafting, verified as K+1 tokens (the last accepted one plus K drafts)."""
    k = f.max_draft_len
    args = [
        "--model-path",
        f"{BUNDLE_VAR}/target",
        "--tokenizer-path",
        f"{BUNDLE_VAR}/tokenizer",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        f"{BUNDLE_VAR}/draft",
        "--speculative-num-steps",
        str(k),
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        str(k + 1),
        "--tp-size",
        str(f.tensor_parallel_size),
        "--max-running-requests",
        str(f.max_batch_size),
        "--kv-cache-dtype",
        _KV["sglang"][f.kv_cache],
    ]
    if f.context_len:
        args += ["--context-length", str(f.context_len)]
    if f.cuda_graph_max_batch:
        args += ["--cuda-graph-max-bs", str(f.cuda_graph_max_batch)]
    return args


OPTIONS_VAR = "$OPTIONS"


def trtllm_serve_args() -> list[str]:
    # Tokenizer, parallelism and limits come from the options file, which overrides trtllm-serve's
    # flags; $OPTIONS is the launch-time copy with absolute paths.
    return ["--extra_llm_api_options", OPTIONS_VAR]


def check_options(engine: str, args: list[str], spec: dict | None = None) -> None:
    """Every ``--name`` in ``args`` must be one the engine documents (and every speculative key)."""
    table = {"vllm": VLLM_SERVE_OPTIONS, "sglang": SGLANG_OPTIONS, "trtllm-serve": TRTLLM_SERVE_OPTIONS}[engine]
    unknown = [a for a in args if a.startswith("--") and a not in table]
    if spec is not None:
        unknown += [f"speculative-config.{k}" for k in spec if k not in VLLM_SPECULATIVE_KEYS]
        if spec.get("method") != "eagle3":
            unknown.append(f"speculative-config.method={spec.get('method')}")
    kv = args[args.index("--kv-cache-dtype") + 1] if "--kv-cache-dtype" in args else None
    if kv is not None and kv not in {"vllm": VLLM_KV_DTYPES, "sglang": SGLANG_KV_DTYPES}.get(engine, {kv}):
        unknown.append(f"--kv-cache-dtype {kv}")
    if unknown:
        raise UserError(f"launch/{engine}", f"options not in {engine}'s documented set: {', '.join(unknown)}", "update build/other_engines.py")


# ---------------------------------------------------------------------------------------------
# Scripts

_HEADER = """#!/usr/bin/env bash
# {title}
# Written by eagle3-trt for this bundle; paths are found from this script's location, so the
# bundle can be moved. HOST/PORT come from the environment (default 127.0.0.1:{port}); extra
# arguments are passed through. Pick GPUs with CUDA_VISIBLE_DEVICES (one server per TP group).
set -euo pipefail
BUNDLE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")/.." && pwd)"
HOST="${{HOST:-127.0.0.1}}"
PORT="${{PORT:-{port}}}"
"""


def _shell_args(args: list[str]) -> str:
    """Quote each argument for bash, keeping $BUNDLE expandable inside double quotes."""
    out = []
    for a in args:
        if BUNDLE_VAR in a or a == OPTIONS_VAR:
            out.append('"' + a.replace('"', '\\"') + '"')
        else:
            out.append(shlex.quote(a))
    lines: list[str] = []
    line: list[str] = []
    for a in out:  # one option (and its value) per line, for readable diffs
        if a.startswith("--") and line:
            lines.append(" ".join(line))
            line = []
        line.append(a)
    if line:
        lines.append(" ".join(line))
    return " \\\n  ".join(lines)


def vllm_script(f: BundleFacts) -> str:
    args, spec = vllm_args(f)
    check_options("vllm", args, spec)
    # JSON is built by the shell so $BUNDLE expands; the draft path is the only string in it.
    spec_line = f'SPEC="$(printf \'{{"method": "eagle3", "model": "%s", "num_speculative_tokens": %d}}\' "$BUNDLE/draft" {f.max_draft_len})"\n'
    title = "vLLM OpenAI server with EAGLE-3 speculative decoding (--speculative-config method eagle3)"
    if f.serving is not None:
        fixed = json.dumps({**spec, "model": "%s"})  # the draft path is the only string the shell fills in
        spec_line = f'SPEC="$(printf \'{fixed}\' "$BUNDLE/draft")"\n'
        title = f"vLLM OpenAI server with {f.method} speculative decoding (--speculative-config {json.dumps({k: v for k, v in spec.items() if k != 'model'})})"
    body = _shell_args(args).replace(shlex.quote("__SPEC_JSON__"), '"$SPEC"').replace("__SPEC_JSON__", '"$SPEC"')
    return _HEADER.format(title=title, port=8000) + spec_line + f'exec vllm serve "$BUNDLE/target" \\\n  {body} \\\n  --host "$HOST" --port "$PORT" "$@"\n'


def sglang_script(f: BundleFacts) -> str:
    args = sglang_args(f)
    check_options("sglang", args)
    return (
        _HEADER.format(title="SGLang server with EAGLE-3 speculative decoding (--speculative-algorithm EAGLE3, top-1 chain)", port=30000)
        + 'PYTHON="${PYTHON:-python3}"\n'
        + f'exec "$PYTHON" -m sglang.launch_server \\\n  {_shell_args(args)} \\\n  --host "$HOST" --port "$PORT" "$@"\n'
    )


def trtllm_serve_yamls(opts: LlmApiOptions) -> dict[str, str]:
    """File name -> text of the trtllm-serve options file of each release band."""
    base = adapter.serve_yaml(opts)
    out = {}
    for band, version, pattern in versions.LAUNCH_BANDS:
        d = dict(base)
        spec, sa_notes = drop_sa_for_launch(d["speculative_config"], version or None)
        spec, dt_notes = drop_dynamic_tree_for_launch(spec, version or None)  # speculative/dynamic_tree/release.py
        sa_notes += dt_notes
        spec, sampling_notes = sampling_for_release(spec, version or None, launch=True)
        sa_notes += sampling_notes
        spec, variant_notes = variant_for_release(spec, version or None, launch=True)
        sa_notes += variant_notes
        spec, notes = versions.spec_for_release(spec, version or None, where=f"{LAUNCH_DIR}/{TRTLLM_SERVE_YAMLS[band]}")
        notes = sa_notes + notes
        d["speculative_config"] = spec
        text = yaml.safe_dump(d, sort_keys=False)
        for line in text.splitlines():
            for key in _PATH_LINES:
                if line.startswith(key) and not _PLAIN_RELATIVE.fullmatch(line[len(key) :]):
                    raise UserError(
                        f"{adapter.OPTIONS_FILE}:{key.strip(': ')}",
                        f"{line[len(key) :]!r} is not a plain path relative to the bundle",
                        "bundle paths are relative to the bundle directory (e.g. draft, target)",
                    )
        which = "TensorRT-LLM 1.3 and newer" if band == "current" else f"TensorRT-LLM {pattern.rstrip('.*')}.x"
        header = (
            f"# trtllm-serve --extra_llm_api_options file for {which}; paths relative to the bundle directory.\n"
            "# launch/trtllm-serve.sh picks the file for the installed release and makes the paths absolute.\n" + "".join(f"# NOTE: {n}\n" for n in notes)
        )
        out[TRTLLM_SERVE_YAMLS[band]] = header + text
    return out


def trtllm_serve_script(f: BundleFacts) -> str:
    args = trtllm_serve_args()
    check_options("trtllm-serve", args)
    multi = (
        "# Several nodes: run under the MPI launcher, one task per GPU, e.g.\n"
        f"#   srun -N 2 --ntasks-per-node 8 --mpi=pmix trtllm-llmapi-launch /abs/path/to/bundle/{LAUNCH_DIR}/trtllm-serve.sh\n"
        if f.tensor_parallel_size > 8
        else "# Tensor parallelism on one node needs no launcher: trtllm-serve starts its own MPI workers.\n"
    )
    bands = "".join(f'  {pattern}) SRC="$BUNDLE/{LAUNCH_DIR}/{TRTLLM_SERVE_YAMLS[band]}" ;;\n' for band, _, pattern in versions.LAUNCH_BANDS)
    paths = " ".join(f"-e \"s|^{key}\\(.*\\)$|{key}'$Q/\\1'|\"" for key in _PATH_LINES)
    return (
        _HEADER.format(title="trtllm-serve (TensorRT-LLM OpenAI server) with EAGLE-3 one-model speculation", port=8000)
        + multi
        + "# Under trtllm-llmapi-launch only rank 0 runs this script; the other ranks load the model from the\n"
        + "# arguments rank 0 sends, in their own working directory. So every path handed to trtllm-serve is\n"
        + "# absolute: the options file is copied to $TMPDIR with its bundle-relative paths made absolute.\n"
        + "# trtllm-llmapi-launch splits its command on spaces: call this script by a path without any.\n"
        + "# The options file depends on the TensorRT-LLM release (TRTLLM_VERSION overrides the detection).\n"
        + 'if [ -z "${TRTLLM_VERSION:-}" ]; then\n'
        + '  TRTLLM_VERSION="$(python3 -c \'import importlib.metadata as m; print(m.version("tensorrt_llm"))\' 2>/dev/null || true)"\n'
        + "fi\n"
        + 'case "$TRTLLM_VERSION" in\n'
        + f"  {versions.UNSUPPORTED_PATTERN})\n"
        + f'    echo "trtllm-serve.sh: TensorRT-LLM $TRTLLM_VERSION is older than {versions.MIN_SUPPORTED}, the first release that loads this bundle" >&2\n'
        + "    exit 2 ;;\n"
        + bands
        + "esac\n"
        + 'case "$BUNDLE" in *$\'\\n\'*) echo "trtllm-serve.sh: the bundle path contains a newline" >&2; exit 2 ;; esac\n'
        + "Q=\"${BUNDLE//\\'/\\'\\'}\"  # YAML single-quoted scalar: ' doubles\n"
        + "Q=\"$(printf '%s' \"$Q\" | sed -e 's/[\\\\&|]/\\\\&/g')\"  # sed replacement text\n"
        + 'OPTIONS="$(mktemp --suffix=.yaml "${TMPDIR:-/tmp}/eagle3-trtllm-serve.XXXXXX")"\n'
        + f'sed {paths} "$SRC" > "$OPTIONS"\n'
        + 'echo "trtllm-serve.sh: TensorRT-LLM ${TRTLLM_VERSION:-version unknown}: ${SRC#"$BUNDLE/"} with absolute paths in $OPTIONS" >&2\n'
        + f'exec trtllm-serve "$BUNDLE/target" \\\n  {_shell_args(args)} \\\n  --host "$HOST" --port "$PORT" "$@"\n'
    )


def launch_readme(f: BundleFacts) -> str:
    k, tp = f.max_draft_len, f.tensor_parallel_size
    conc = (
        f"TensorRT-LLM 1.3 and newer turn speculation off above {f.max_concurrency} concurrent requests (max_concurrency); "
        "1.2.x accepts the option but its one-model EAGLE-3 speculates at every batch size. vLLM and SGLang have no "
        "equivalent flag here, so compare them at or below that concurrency."
        if f.max_concurrency
        else "The bundle sets no concurrency limit for speculation; all three engines speculate at every batch size."
    )
    ctx = f.context_len
    if ctx and f.max_seq_len and ctx < f.max_seq_len:
        ctx_note = (
            f"vLLM and SGLang get a context length of {ctx}, the draft's max_position_embeddings, below the bundle's "
            f"max_seq_len {f.max_seq_len}: past the draft's positions vLLM hits a device assert (vllm-project/vllm "
            "#48894) and SGLang refuses the longer context (sgl-project/sglang #9388). Raise the draft config's "
            "max_position_embeddings if its rope supports it."
        )
    elif ctx:
        ctx_note = (
            f"vLLM and SGLang get a context length of {ctx} (the bundle's max_seq_len, within the draft's {f.draft_max_positions or 'unknown'} positions)."
        )
    else:
        ctx_note = "No context length is passed: the bundle sets no max_seq_len and the draft config has no max_position_embeddings."
    return f"""# Launching this bundle with other engines

Same quantized target (`target/`, {f.quant.get("target", "?")}) and EAGLE-3 draft (`draft/`, {f.quant.get("draft", "?")}),
K = {k} draft tokens, tensor parallel size {tp}, KV cache {f.kv_cache}. Each script binds
127.0.0.1 unless HOST is set, passes extra arguments through, and hands the engine absolute
paths found from its own location (the bundle can be moved).

| script | engine | speculative options |
|---|---|---|
| `trtllm-serve.sh` | TensorRT-LLM `trtllm-serve` | `{TRTLLM_SERVE_YAML}` (1.3 and newer) or `{TRTLLM_SERVE_YAMLS["1.2"]}` (1.2.x): Eagle3, max_draft_len {k}, one-model |
| `vllm.sh` | `vllm serve` | `--speculative-config {{"method": "eagle3", "model": draft, "num_speculative_tokens": {k}}}` |
| `sglang.sh` | `python -m sglang.launch_server` | `--speculative-algorithm EAGLE3 --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}` |

Notes
- All three read the ModelOpt checkpoint's `hf_quant_config.json` / `quantization_config` and pick
  their FP8 / NVFP4 kernels from it; no `--quantization` flag is passed.
- A linear chain of K tokens in SGLang is K steps at top-1, verified as K+1 tokens.
- {conc}
- {ctx_note}
- The public EAGLE-3 drafts need the chat template: use the chat-completions endpoint
  (`/v1/chat/completions`) of each server, or apply the template yourself.
- `trtllm-serve.sh` picks the options file for the installed TensorRT-LLM (`TRTLLM_VERSION=1.2.1`
  overrides the detection), writes a copy with absolute paths to `$TMPDIR` and passes that copy:
  under `trtllm-llmapi-launch` the ranks other than 0 load the model in their own working
  directory, where bundle-relative paths do not resolve. Do not pass `llm_api_options.yaml`
  itself to trtllm-serve: its `model:` key overrides the positional model, and it is written for
  the newest release.
- Both options files use `speculative_model_dir`, which every TensorRT-LLM release from 1.2
  accepts (newer releases call it `speculative_model` and keep the old name as an alias).
  Differences by release are listed in `build/trtllm_versions.py` of eagle3-trt.
- Several GPUs: TP comes from the bundle; to run several instances on one node start one server
  per GPU group (`CUDA_VISIBLE_DEVICES=0,1 PORT=8001 launch/vllm.sh`, ...). Several nodes
  (TensorRT-LLM only): `srun ... trtllm-llmapi-launch /abs/path/launch/trtllm-serve.sh`; the
  path must contain no spaces (trtllm-llmapi-launch splits its command on them) and the bundle
  must be at the same path on every node.
"""


def launcher_files(opts: LlmApiOptions, *, target_format: str, draft_format: str, draft_max_positions: int | None = None) -> dict[str, str]:
    """File name -> text of every file in ``launch/`` (scripts are written executable).
    ``draft_max_positions``: the draft config's max_position_embeddings (caps vLLM's and SGLang's context)."""
    f = bundle_facts(opts, target_format=target_format, draft_format=draft_format, draft_max_positions=draft_max_positions)
    if f.serving is not None:  # a method with its own head: only the engines that serve it
        return {"vllm.sh": vllm_script(f), "README.md": method_launch_readme(f)}
    return {
        "vllm.sh": vllm_script(f),
        "sglang.sh": sglang_script(f),
        "trtllm-serve.sh": trtllm_serve_script(f),
        **trtllm_serve_yamls(opts),
        "README.md": launch_readme(f),
    }


def method_launch_readme(f: BundleFacts) -> str:
    """launch/README.md of a bundle whose head is a method's own: what serves it, what does not and why."""
    assert f.serving is not None
    spec = json.dumps({**f.serving["vllm"], "model": "draft"})
    why = "\n".join(f"- {name}: not served: {entry['why']}" for name, entry in f.serving.items() if isinstance(entry, dict) and entry.get("served") is False)
    return f"""# Launching this bundle

Quantized target (`target/`, {f.quant.get("target", "?")}) and a {f.method} head (`draft/`, in the format its
serving engine reads), K = {f.max_draft_len} draft tokens from one draft forward, tensor parallel size
{f.tensor_parallel_size}, KV cache {f.kv_cache}. The script binds 127.0.0.1 unless HOST is set, passes extra
arguments through, and hands the engine absolute paths found from its own location.

| script | engine | speculative options |
|---|---|---|
| `vllm.sh` | `vllm serve` | `--speculative-config {spec}` |

Not launched from this bundle:
{why}

`eagle3-trt compile` and `package-triton` refuse this bundle in one line for the same reason; `eagle3-trt alpha`
measures it with the reference runtime (the method's drafting exactly as vLLM's proposer runs it).
"""
