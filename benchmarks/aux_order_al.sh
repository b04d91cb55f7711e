#!/bin/bash
# AL of models/tiny's trained head (aux layers [1, 3, 4]) on its held-out prompts, served three ways:
# ids listed sorted, listed [4, 1, 3] (the same set: served unchanged since issue 27), and the function the
# toolkit served for [4, 1, 3] before issue 27 (fc's blocks permuted). Usage: OUT=dir bash benchmarks/aux_order_al.sh
set -e
cd "$(dirname "$0")/.."
M=${OUT:-/tmp/aux-order}; mkdir -p $M
rm -rf "$M"/sorted "$M"/unsorted "$M"/old_permuted "$M"/b-* "$M"/a-*
.venv/bin/python - <<'PY'
import json, shutil, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
src = Path("models/tiny/draft"); M = Path(__import__("os").environ.get("OUT", "/tmp/aux-order"))
for name in ("sorted", "unsorted", "old_permuted"):
    shutil.copytree(src, M / name)
for name in ("unsorted", "old_permuted"):
    c = json.loads((M / name / "config.json").read_text()); c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [4, 1, 3]
    (M / name / "config.json").write_text(json.dumps(c))
# what the toolkit served for the unsorted list before this change: fc's blocks permuted into sorted order
W = load_file(str(M / "old_permuted" / "model.safetensors")); T = 192; ids = [4, 1, 3]
order = sorted(range(3), key=lambda i: ids[i])
W["fc.weight"] = torch.cat([W["fc.weight"][:, i * T:(i + 1) * T] for i in order], 1).contiguous()
save_file(W, str(M / "old_permuted" / "model.safetensors"))
c = json.loads((M / "old_permuted" / "config.json").read_text()); c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 3, 4]
(M / "old_permuted" / "config.json").write_text(json.dumps(c))
PY
for name in sorted unsorted old_permuted; do
  .venv/bin/eagle3-trt engine --target models/tiny/target --draft $M/$name --target-gpu h100 --quant bf16 --skip-behaviour-checks -o $M/b-$name > $M/build-$name.log 2>&1
  .venv/bin/eagle3-trt alpha $M/b-$name --prompts models/tiny/heldout_prompts.json --max-tokens 64 -o $M/a-$name > $M/alpha-$name.log 2>&1
  echo "== $name"; grep -iE "AL|acceptance|alpha" $M/alpha-$name.log | head -5
done
