"""The draft decoder layers' tensor names: speculators' and ModelOpt's ``layers.{i}.*`` under TensorRT-LLM's.

One rule for every head that stores its layers as ``layers.{i}.*`` (EAGLE-3 heads from speculators and
ModelOpt: convert/draft_format.py; a method's own head format: its home's reader), as
TensorRT-LLM's ``Eagle3ForCausalLM.load_weights`` renames them: ``midlayer.*`` for a one-layer head,
``midlayer.{i}.*`` for several. A later
layer's ``input_layernorm`` (a plain decoder layer in speculators) is the norm TensorRT-LLM's regular
layer calls ``hidden_norm``, in the same place (formats/draft_producers.py: Extra layers).
"""

from __future__ import annotations

import re
from typing import TypeVar

T = TypeVar("T")

_LAYER = re.compile(r"^layers\.(\d+)\.(.*)$")


def trtllm_layer_names(tensors: dict[str, T], num_layers: int) -> dict[str, T]:
    """``tensors`` with ``layers.{i}.*`` renamed for a head of ``num_layers`` decoder layers; other names
    kept. A one-layer head keeps a ``layers.{i}.*`` with i >= 1 as it is, so the shape checks name it
    as a tensor the draft does not have (it would otherwise overwrite layer 0's)."""
    out: dict[str, T] = {}
    for k, v in tensors.items():
        m = _LAYER.match(k)
        if m is not None:
            i, rest = int(m.group(1)), m.group(2)
            if num_layers == 1 and i == 0:
                k = "midlayer." + rest
            elif num_layers > 1:
                if i >= 1 and rest == "input_layernorm.weight":
                    rest = "hidden_norm.weight"
                k = f"midlayer.{i}.{rest}"
        out[k] = v
    return out
