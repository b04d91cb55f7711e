"""Client-side chat template, taken from the bundle's tokenizer.

The llmapi model sends ``text_input`` to the runtime as-is, with no chat template (NVIDIA/TensorRT-LLM
``triton_backend/all_models/llmapi/tensorrt_llm/1/model.py``); EAGLE-3 heads are trained on
chat-formatted text and lose acceptance without the template (TensorRT-LLM maintainers on the
yuhuili Llama-3.3 drafts, NVIDIA/TensorRT-LLM PR #4802), so clients format the prompt before
sending it.

The template is rendered with jinja2 the way ``transformers``' ``apply_chat_template`` does
(sandboxed, trim_blocks/lstrip_blocks, loop controls, ``raise_exception``, ``strftime_now``,
non-escaping ``tojson``), so a client does not import transformers (and torch) for it; a
template that needs more falls back to transformers itself.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from eagle3_trt.errors import UserError
from eagle3_trt.formats.generation import token_text

_SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


def tokenizer_dir(path: Path) -> Path:
    """A bundle (its tokenizer/ folder), or a directory that holds tokenizer files."""
    path = Path(path)
    for cand in (path / "tokenizer", path / "target", path):
        if (cand / "tokenizer_config.json").is_file():
            return cand
    raise UserError(path, "no tokenizer_config.json found (looked in tokenizer/, target/ and the directory itself)", "pass the engine bundle directory")


class ChatTemplate:
    def __init__(self, template: str, special: dict[str, str], source: Path):
        self.template = template
        self.special = special
        self.source = source
        self._compiled: jinja2.Template | None = None

    @classmethod
    def from_dir(cls, path: Path) -> ChatTemplate:
        d = tokenizer_dir(path)
        cfg_path = d / "tokenizer_config.json"
        try:
            cfg = json.loads(cfg_path.read_text())
        except ValueError as e:
            raise UserError(cfg_path, f"not valid JSON: {e}") from None
        template = cfg.get("chat_template")
        if template is None and (d / "chat_template.jinja").is_file():
            template = (d / "chat_template.jinja").read_text()
        if isinstance(template, list):  # named templates: use "default"
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        if not template:
            raise UserError(cfg_path, "the tokenizer has no chat_template", "send raw text with --no-chat-template")
        special = {k: t for k in _SPECIAL_KEYS if (t := token_text(cfg.get(k))) is not None}
        return cls(template, special, d)

    def _compile(self) -> jinja2.Template:
        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(self.template)

    def render(self, messages: list[dict]) -> str:
        try:
            compiled = self._compiled = self._compiled or self._compile()
            return compiled.render(messages=messages, add_generation_prompt=True, **self.special)
        except jinja2.exceptions.TemplateSyntaxError:
            # e.g. {% generation %} blocks: let transformers render it.
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(self.source), trust_remote_code=False)
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert isinstance(text, str)  # tokenize=False returns the rendered text
            return text


@lru_cache(maxsize=8)
def load_chat_template(path: str) -> ChatTemplate:
    return ChatTemplate.from_dir(Path(path))


def format_prompt(template: ChatTemplate, prompt: str, system: str | None = None) -> str:
    """``prompt`` as one user turn with the generation prompt appended (text, not ids)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return template.render(messages)


class PromptFormatter:
    """Callable that formats prompts with a bundle's chat template, or passes them through."""

    def __init__(self, bundle: Path | None, system: str | None = None, raw: bool = False):
        self.raw = raw or bundle is None
        self.system = system
        self.template = None if self.raw else load_chat_template(str(Path(bundle).resolve()))  # type: ignore[arg-type]

    def __call__(self, prompt: str) -> str:
        return prompt if self.template is None else format_prompt(self.template, prompt, self.system)
