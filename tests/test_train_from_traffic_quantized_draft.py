"""`train-draft --traffic --from` a bundle whose draft the build quantized (NVFP4 for Blackwell): the
BF16 source head is fine-tuned and the new draft is calibrated and quantized the way the parent's was."""

from __future__ import annotations

import json
import random

from eagle3_trt.formats.checkpoint_io import read_json, sha256_file
from eagle3_trt.pipeline.bundle import open_bundle, verify
from eagle3_trt.testing.served_traffic import served_records, write_traffic
from eagle3_trt.train.from_traffic import TrafficTrainOptions, train_from_traffic


def test_quantized_draft_parent_gets_a_quantized_retrained_draft(nvfp4_bundle, tmp_path):
    parent = open_bundle(nvfp4_bundle)
    assert parent.quant.draft == "nvfp4"
    rng = random.Random(9)
    prompts = [[rng.randrange(3, 200) for _ in range(8)] for _ in range(8)]
    traffic = write_traffic(tmp_path / "traffic", served_records(nvfp4_bundle, prompts, max_tokens=6))
    out = tmp_path / "child"
    report = train_from_traffic(
        TrafficTrainOptions(traffic=traffic, parent=nvfp4_bundle, out=out, steps=2, min_records=4, eval_samples=1, eval_tokens=4, threads=1, quiet=True)
    )
    child = open_bundle(out)
    assert verify(child) == [] and child.quant == parent.quant
    qc = read_json(out / "draft/config.json")["quantization_config"]
    assert qc["quant_algo"] == read_json(nvfp4_bundle / "draft/config.json")["quantization_config"]["quant_algo"] == "NVFP4"
    assert sha256_file(out / "draft/model.safetensors") != sha256_file(nvfp4_bundle / "draft/model.safetensors")
    lin = child.manifest.lineage
    assert lin is not None and lin.parent_fingerprint == parent.manifest.fingerprint and lin.training["draft_calibration_prompts"] > 0
    # the head trained is the BF16 one (the manifest's draft source), and it is the one quantized
    head = json.loads((out.parent / "child.head" / "train_report.json").read_text())
    assert head["bundle"] == str(out) == report["bundle"]
    assert child.manifest.sources.draft.path == str((out.parent / "child.head").resolve())
    assert "quantization_config" not in read_json(out.parent / "child.head" / "config.json")
