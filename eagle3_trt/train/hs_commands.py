"""`eagle3-trt hidden-states`: write a hidden-state cache through an engine, or convert one to and
from ModelOpt's and speculators' offline formats (formats/hidden_states.py documents the cache)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from eagle3_trt.errors import UserError
from eagle3_trt.train import hs_convert
from eagle3_trt.train.hs_collect import collect_with_backend


def _aux(value: str | None, required: bool = False) -> list[int] | None:
    if not value:
        if required:
            raise UserError(
                "--aux-layers", "is required for this source (its files do not name the layers)", "e.g. --aux-layers 1,15,28 (TensorRT-LLM convention)"
            )
        return None
    try:
        return sorted(int(x) for x in value.split(","))
    except ValueError:
        raise UserError("--aux-layers", f"{value!r} is not a comma-separated list of layer numbers", "e.g. --aux-layers 1,15,28") from None


@click.group("hidden-states")
def hidden_states_cmd() -> None:
    """Write target hidden states through an engine (reference, Hugging Face device_map, TensorRT-LLM), or convert them for other trainers."""


@hidden_states_cmd.command("collect")
@click.option("--backend", type=click.Choice(["reference", "hf", "trtllm"]), default="reference", show_default=True)
@click.option("--target", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None, help="Target HF checkpoint (reference, hf).")
@click.option(
    "--bundle", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None, help="Engine bundle whose target TensorRT-LLM serves (trtllm)."
)
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path), help="JSONL/txt as train-draft reads it.")
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path), help="Cache directory to write (must not exist).")
@click.option("--aux-layers", default=None, help="Capture layers, TensorRT-LLM convention [default: 1,L/2-1,L-4].")
@click.option("--device-map", default="auto", show_default=True, help="hf: transformers device_map (auto spreads the layers over this node's GPUs; cpu).")
@click.option("--device", default="cpu", show_default=True, help="reference: cpu or cuda.")
@click.option("--seq-len", default=512, show_default=True, type=int)
@click.option("--batch-size", default=8, show_default=True, type=int)
def collect_cmd(backend: str, target: Path | None, bundle: Path | None, data: Path, out: Path, aux_layers: str | None, **kw: Any) -> None:
    """Teacher-force the data's token windows through the target with BACKEND and write a cache."""
    meta = collect_with_backend(backend, target, bundle, data, out, _aux(aux_layers), **kw)
    click.echo(json.dumps({"output": str(out), "rows": meta.rows, "seq_len": meta.seq_len, "aux_layer_ids": meta.aux_layer_ids, "producer": meta.producer}))


@hidden_states_cmd.command("convert")
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--from", "src_format", type=click.Choice(["cache", "modelopt", "speculators", "trtllm"]), required=True)
@click.option("--to", "dst_format", type=click.Choice(["cache", "modelopt", "speculators"]), required=True)
@click.option(
    "--target", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None, help="The target (its final norm): speculators both ways."
)
@click.option("--aux-layers", default=None, help="Layers the source captured, TensorRT-LLM convention (importing).")
def convert_cmd(src: Path, out: Path, src_format: str, dst_format: str, target: Path | None, aux_layers: str | None) -> None:
    """Convert SRC (a cache, ModelOpt's .pt dump, speculators' offline data or TensorRT-LLM's SaveState files) to OUT."""
    if Path(out).exists():
        raise UserError(out, "exists", "choose a new output directory")
    if (src_format == "cache") == (dst_format == "cache"):
        raise UserError("--to", f"{src_format} -> {dst_format}: one side must be the project's cache", "e.g. --from modelopt --to cache")
    if "speculators" in (src_format, dst_format) and target is None:
        raise UserError("--target", "is required for speculators (its last state is before the final norm)", "pass the target the states came from")
    if src_format == "cache":
        n = hs_convert.to_modelopt(src, out) if dst_format == "modelopt" else hs_convert.to_speculators(src, out, target)  # type: ignore[arg-type]
        click.echo(json.dumps({"output": str(out), "format": dst_format, "rows": n}))
        return
    aux = _aux(aux_layers, required=True)
    assert aux is not None
    if src_format == "modelopt":
        meta = hs_convert.from_modelopt(src, out, aux, target)
    elif src_format == "speculators":
        meta = hs_convert.from_speculators(src, out, target, aux)  # type: ignore[arg-type]
    else:
        meta = hs_convert.from_trtllm(src, out, aux)
    click.echo(json.dumps({"output": str(out), "format": "cache", "rows": meta.rows, "seq_len": meta.seq_len}))
