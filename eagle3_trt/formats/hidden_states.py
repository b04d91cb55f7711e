"""The on-disk format of a hidden-state cache: what ``train-draft`` trains from, whichever engine
produced it (``eagle3-trt hidden-states --backend reference|hf|trtllm``) or whichever trainer's
offline format it was converted from (``eagle3-trt hidden-states convert``).

A cache is one directory::

    manifest.json                  CacheManifest below (read by ``read_manifest``, the one reader)
    shard_00000.safetensors        rows 0 .. shards[0]-1
    shard_00001.safetensors        ...

Each shard holds, for its ``n`` rows (token windows) of ``seq_len`` positions, right-padded:

    input_ids  int64 [n, seq_len]         token ids (padding: the tokenizer's pad id, else 0)
    real       bool  [n, seq_len]         True where the position is a real token (trained on)
    aux        bf16  [n, seq_len, A*T]    outputs of the target's decoder layers ``aux_layer_ids``
                                          (TensorRT-LLM convention: layer i's output, the residual
                                          stream after layer i, 0-based), concatenated in ascending
                                          layer order -- what the head's ``fc`` reads
    last       bf16  [n, seq_len, T]      the target's final hidden state AFTER its final norm
                                          (``lm_head(last)`` are the target's logits; training
                                          recomputes the target's distribution from it)

T is ``target_hidden_size``, A is ``len(aux_layer_ids)``. The layer convention is TensorRT-LLM's
(``tensorrt_llm/_torch/speculative/eagle3.py``, ``Eagle3SpecMetadata.maybe_capture_hidden_states``:
``hidden_states + residual`` of the layer whose ``layer_id`` is captured; NVIDIA/TensorRT-LLM
commit f933a608045a46426792263617475b359d568043), which is Hugging Face's ``hidden_states[i + 1]``.

The format imports no torch: this module is the schema; train/hidden_states.py reads and writes
the tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

CACHE_SCHEMA = 1
MANIFEST = "manifest.json"
SHARD_KEYS = ("input_ids", "real", "aux", "last")
# who wrote the states: an engine backend, or a converter from another trainer's offline format
Producer = Literal["reference", "hf", "trtllm", "modelopt", "speculators"]


def shard_name(i: int) -> str:
    return f"shard_{i:05d}.safetensors"


class CacheManifest(BaseModel):
    """<cache>/manifest.json: what the shards hold and the key of the run that wrote them."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: int = Field(alias="schema")
    key: str  # identity of (target, layers, windows): a cache with another key is rebuilt
    seq_len: int
    aux_layer_ids: list[int]  # TensorRT-LLM convention, ascending
    target_hidden_size: int
    shards: list[int]  # rows per shard, in shard order
    producer: Producer = "reference"
    last_is_post_norm: Literal[True] = True  # ``last`` is always after the final norm (see above)

    @property
    def rows(self) -> int:
        return sum(self.shards)


def read_manifest(cache_dir: Path) -> CacheManifest | None:
    """The cache's manifest, or None when there is none, it is from another schema or damaged
    (a cache train-draft built is then rebuilt: it is derived data)."""
    f = Path(cache_dir) / MANIFEST
    try:
        m = CacheManifest.model_validate_json(f.read_text())
    except (OSError, ValidationError):
        return None
    return m if m.schema_ == CACHE_SCHEMA else None
