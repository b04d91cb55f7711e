"""`train-draft --traffic DIR --from BUNDLE`: the command side (train/commands.py hands over here).

Options shared with plain train-draft keep their meaning (--steps, --lr [default 1e-4: a fine-tune],
--batch-size, --seq-len, --gen-tokens, --eval-samples, --eval-tokens, --seed, --threads, --device,
--overwrite, --keep-work, --json); K and the capture layers are the bundle's. Options that name
another input (--target, --data, --init, --aux-layers, --generate, --resume) are refused with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from eagle3_trt.errors import UserError
from eagle3_trt.train.from_traffic import TrafficTrainOptions, summary_lines, train_from_traffic

# the traffic-only options of train-draft and their defaults (a value other than these needs --traffic)
TRAFFIC_ONLY: dict[str, Any] = {
    "from_bundle": None,
    "holdout_fraction": 0.2,
    "endpoint": None,
    "endpoint_model": "eagle3",
    "allow_other_bundles": False,
    "min_records": 8,
    "replay_fraction": 0.5,
}
_OTHER_INPUTS = ("target", "data", "init", "generate", "resume")


def train_from_traffic_cmd(traffic: Path, topts: dict[str, Any], options: dict[str, Any], aux_layers: str | None, as_json: bool) -> None:
    if topts["from_bundle"] is None:
        raise UserError("--from", "is required with --traffic", "pass the bundle that served the traffic: --traffic DIR --from BUNDLE")
    for name in _OTHER_INPUTS:
        if options.get(name):
            raise UserError(f"--{name}", "does not apply with --traffic", "the prompts come from --traffic, the target and head from --from BUNDLE")
    if not 0.0 <= topts["replay_fraction"] <= 4.0:
        raise UserError(
            "--replay-fraction", f"{topts['replay_fraction']} is not in [0, 4]", "0 trains on the traffic alone; 0.5 mixes one general prompt per two"
        )
    if aux_layers:
        raise UserError("--aux-layers", "does not apply with --traffic", "the new head reads the layers the --from bundle captures")
    o = TrafficTrainOptions(
        traffic=traffic,
        parent=topts["from_bundle"],
        out=options["out"],
        seed=options["seed"],
        holdout_fraction=topts["holdout_fraction"],
        steps=options["steps"],
        lr=options["lr"] or 1e-4,
        batch_size=options["batch_size"],
        seq_len=options["seq_len"],
        gen_tokens=options["gen_tokens"],
        endpoint=topts["endpoint"],
        endpoint_model=topts["endpoint_model"],
        allow_other_bundles=topts["allow_other_bundles"],
        min_records=topts["min_records"],
        replay_fraction=topts["replay_fraction"],
        eval_samples=options["eval_samples"],
        eval_tokens=options["eval_tokens"],
        device=options["device"],
        threads=options["threads"],
        overwrite=options["overwrite"],
        keep_work=options["keep_work"],
        quiet=as_json,
    )
    report = train_from_traffic(o)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for line in summary_lines(report):
        click.echo(line)
