"""Make the embedded tiny pairs (models/tiny/, models/tiny-qwen3/): a small target trained on the
Python standard library's source and an EAGLE-3 head trained for it with `train-draft`'s own code path.

    python -m eagle3_trt.testing.make_tiny_pair -o models/tiny [--overwrite]
    python -m eagle3_trt.testing.make_tiny_pair --family qwen3 -o models/tiny-qwen3 [--overwrite]
    python -m eagle3_trt.testing.make_tiny_pair --family gpt-oss -o models/tiny-gpt-oss [--overwrite]

The target's architecture is its family's transformers class (convert/families.py): a Llama for
``tiny``; a Qwen3 (per-head q/k norms, head_dim not hidden/heads, tied embeddings) for ``tiny-qwen3``,
whose recipe is short enough (< 2 min on 2 cores) to be re-made at will.

Reproducible: fixed seeds, a fixed sorted file list, fixed step counts (testing/tiny_recipe.py).
The standard library differs slightly between Python versions, so the committed weights are the reference and this script is how they were made; MODEL_CARD.md
records the Python version, the files used and the measured run time.

Stages: byte-level BPE tokenizer (Llama-3 special tokens and chat template) -> target
pre-training on random windows -> draft training (train.train_draft, as the CLI runs it) ->
held-out acceptance of the committed bf16 files by greedy speculative decoding -> model card
(testing/tiny_training.py, testing/tiny_model_card.py).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import resource
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
import torch

from eagle3_trt.atomic import staged_dir, write_text
from eagle3_trt.formats.heldout import HELDOUT_FILE, HeldoutPrompts
from eagle3_trt.speculative.registry import trainable_methods
from eagle3_trt.testing.tiny_model_card import model_card
from eagle3_trt.testing.tiny_recipe import RECIPES, Recipe, read_corpus
from eagle3_trt.testing.tiny_training import (
    dir_size,
    draft_jsonl,
    draft_params,
    heldout_prompt_ids,
    measure_committed,
    train_target,
    train_tokenizer,
)
from eagle3_trt.train.train_draft import TrainDraftOptions, train_draft


def make(out: Path, r: Recipe | None = None, overwrite: bool = False, log=print) -> dict:
    r = r or RECIPES["llama"]
    out = Path(out)
    if out.exists() and not overwrite:
        raise click.UsageError(f"{out} exists; pass --overwrite")
    t0, cpu0, load0 = time.time(), _cpu_s(), os.getloadavg()
    torch.set_num_threads(r.threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(r.threads))
    timings: dict[str, Any] = {}
    with staged_dir(out) as pair:
        # Scratch files (tokenizer, draft data and work dir) live inside the staging directory, so an
        # interrupted or killed run leaves nothing beside `out` that the next run does not remove.
        work = pair / ".work"
        work.mkdir()
        train, held, missing = read_corpus()
        if r.train_files:
            train = dict(list(train.items())[: r.train_files])
        t = time.time()
        train_tokenizer(list(train.values()), r.vocab_size, work / "tokenizer")
        timings["tokenizer_s"] = round(time.time() - t, 1)
        log(f"tokenizer: {timings['tokenizer_s']} s")
        t = time.time()
        target_stats = train_target(r, work / "tokenizer", list(train.values()), list(held.values()), pair / "target", log)
        timings["target_s"] = round(time.time() - t, 1)
        log(f"target: {timings['target_s']} s, held-out loss {target_stats['heldout_loss']}")
        data = work / "draft_train.jsonl"
        n_pieces = draft_jsonl(train, r.draft_pieces, r.draft_piece_chars, data, r.draft_copy_pieces, r.seed)
        methods = ["chain"] + (["peagle"] if r.peagle_steps and "peagle" in trainable_methods() else [])
        reports = _train_heads(r, pair, work, data, methods, timings)
        report = reports["chain"]
        log(f"draft: {timings['draft_s']} s, train-split acceptance {report['after']['acceptance_length']}")
        if "peagle" in reports:
            log(f"peagle: {timings['peagle_s']} s")
        for method, rep in reports.items():
            # the report names paths of this machine's temp dir; record what they were instead
            rep["target"] = f"models/{out.name}/target"
            rep["data"] = f"draft_train.jsonl: {n_pieces} pieces of the training files (see MODEL_CARD.md)"
            (pair / ("draft" if method == "chain" else f"draft-{method}") / "train_report.json").write_text(json.dumps(rep, indent=2) + "\n")
            _name_verifier(pair / f"draft-{method}" / "config.json", f"models/{out.name}/target")
        t = time.time()
        acceptance = measure_committed(pair, r, held)
        timings["measure_s"] = round(time.time() - t, 1)
        timings["total_s"] = round(time.time() - t0, 1)
        # wall time depends on what else runs on the machine; the process's CPU time (user + system,
        # this process and its children) and the load average around the run say how loaded it was
        timings["cpu_s"] = round(_cpu_s() - cpu0, 1)
        timings["loadavg_start"] = [round(x, 2) for x in load0]
        timings["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        timings["cores"] = os.cpu_count()
        facts = _facts(out.name, r, train, held, missing, n_pieces, target_stats, report, pair, acceptance, timings)
        (pair / "MODEL_CARD.md").write_text(model_card(facts))
        (pair / "tiny_pair.json").write_text(json.dumps(facts, indent=2) + "\n")
        _write_heldout_prompts(pair, out.name, r, held)
        shutil.rmtree(work)
    return facts


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _name_verifier(config: Path, name: str) -> None:
    """A speculators-format head (P-EAGLE) names its verifier's path; here that was the staging
    directory of this run: record where the target is shipped instead."""
    if not config.is_file():
        return
    cfg = json.loads(config.read_text())
    verifier = cfg.get("speculators_config", {}).get("verifier")
    if isinstance(verifier, dict) and "name_or_path" in verifier:
        verifier["name_or_path"] = name
        config.write_text(json.dumps(cfg, indent=2) + "\n")


def _timed_head(r: Recipe, pair: Path, work: Path, data: Path, method: str) -> tuple[dict, float]:
    t = time.time()
    return _train_draft(r, pair, work, data, method), round(time.time() - t, 1)


def _train_heads(r: Recipe, pair: Path, work: Path, data: Path, methods: list[str], timings: dict) -> dict[str, dict]:
    """The EAGLE-3 head and the P-EAGLE head (issue 29) train on the same target and data and nothing
    else they share, each on one torch thread: with two cores they run side by side, in two spawned
    processes (each result is what the same call gives alone: seeded, one thread), which is what keeps
    `make tiny-pairs` within its 30 minutes."""
    key = {"chain": "draft_s", "peagle": "peagle_s"}
    if len(methods) > 1 and (os.cpu_count() or 1) >= 2:
        with ProcessPoolExecutor(len(methods), mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {m: pool.submit(_timed_head, r, pair, work, data, m) for m in methods}
            done = {m: f.result() for m, f in futures.items()}
        timings["heads_in_parallel"] = True
    else:
        done = {m: _timed_head(r, pair, work, data, m) for m in methods}
    for m, (_, secs) in done.items():
        timings[key[m]] = secs
    return {m: rep for m, (rep, _) in done.items()}


def _train_draft(r: Recipe, pair: Path, work: Path, data: Path, method: str = "chain") -> dict:
    """A head trained by `train-draft`'s own code path on the recipe's settings: the EAGLE-3 draft
    (method chain, into draft/), or the P-EAGLE head (method peagle, into draft-peagle/, peagle_steps)."""
    return train_draft(
        TrainDraftOptions(
            target=pair / "target",
            data=data,
            out=pair / ("draft" if method == "chain" else f"draft-{method}"),
            method=method,
            steps=r.draft_steps if method == "chain" else r.peagle_steps,
            max_draft_len=r.max_draft_len,
            draft_vocab=r.draft_vocab,
            device="cpu",
            seq_len=r.draft_seq,
            batch_size=r.draft_batch,
            lr=r.draft_lr,
            generate=True,
            gen_tokens=r.draft_gen_tokens,
            seed=r.seed,
            eval_samples=16,
            eval_tokens=r.eval_tokens,
            eval_prompt_len=r.eval_prompt_len,
            quiet=not sys.stderr.isatty(),
            threads=r.threads,
            save_every=0,
            work_dir=work / f"{method}.work",
        )
    )


def _facts(
    name: str, r: Recipe, train: dict, held: dict, missing, n_pieces: int, target_stats: dict, report: dict, pair: Path, acceptance, timings: dict
) -> dict:
    """tiny_pair.json: how the pair was made and what it measures (MODEL_CARD.md is written from it)."""
    return {
        "name": name,
        "recipe": asdict(r),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "corpus": {
            "train_files": list(train),
            "heldout_files": list(held),
            "missing_files": missing,
            "draft_pieces": n_pieces,
            "train_chars": sum(map(len, train.values())),
        },
        "target": target_stats,
        "draft": {
            "train_report": "draft/train_report.json",
            "final_loss": report["final_loss"],
            "params": draft_params(pair / "draft"),
            "draft_vocab_coverage": report["draft_vocab_coverage"],
            "train_windows": report["train_windows"],
        },
        "acceptance_heldout": acceptance,
        "timings": timings,
        "sizes": {"target_bytes": dir_size(pair / "target"), "draft_bytes": dir_size(pair / "draft")},
    }


def _write_heldout_prompts(pair: Path, name: str, r: Recipe, held: dict) -> None:
    # what `make engine` measures a bundle of this pair on (convert/embedded.py heldout_prompts)
    paste = (
        f", taken in turn with {r.paste_prompts} paste-and-copy prompts made from the same files (testing/tiny_copy_data.py paste_prompts: "
        "a block pasted twice, a block then '# again:', a block then '# changed:' and its first edited line)"
        if r.paste_prompts
        else ""
    )
    about = (
        f"Held-out prompts for the embedded {name} pair: token ids of {r.eval_prompt_len}-token windows from Python "
        f"standard-library modules neither model was trained on ({', '.join(held)}; PSF License){paste}. "
        "`make engine` measures the built bundle's acceptance on them."
    )
    write_text(pair / HELDOUT_FILE, HeldoutPrompts(about=about, prompts=heldout_prompt_ids(pair, r, held)).model_dump_json() + "\n")


def remeasure_pair(out: Path) -> dict:
    """Measure the committed pair again and rewrite its card and held-out prompts; training facts are kept as recorded."""
    facts = json.loads((out / "tiny_pair.json").read_text())
    # a card written before a recipe field existed: that field as its family's recipe sets it now
    family = {"llama": "llama", "qwen3": "qwen3", "gpt_oss": "gpt-oss"}[facts["recipe"].get("model_type", "llama")]
    r = Recipe(**{**asdict(RECIPES[family]), **facts["recipe"]})
    torch.set_num_threads(r.threads)
    _, held, _ = read_corpus()
    facts["acceptance_heldout"] = measure_committed(out, r, held)
    facts["sizes"] = {"target_bytes": dir_size(out / "target"), "draft_bytes": dir_size(out / "draft")}
    facts["draft"]["params"] = draft_params(out / "draft")
    _write_heldout_prompts(out, facts.get("name", out.name), r, held)  # the prompts the card's figures are measured on
    (out / "tiny_pair.json").write_text(json.dumps(facts, indent=2) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(facts))
    return facts


@click.command("make-tiny-pair")
@click.option("-o", "--output", "out", default="models/tiny", show_default=True, type=click.Path(path_type=Path))
@click.option("--overwrite", is_flag=True)
@click.option("--target-steps", type=int, default=None, help="Override the recipe (for quick experiments).")
@click.option("--draft-steps", type=int, default=None, help="Override the recipe (for quick experiments).")
@click.option("--remeasure", is_flag=True, help="Only measure the existing pair in OUTPUT again and rewrite its card.")
@click.option(
    "--family",
    type=click.Choice(sorted(RECIPES)),
    default="llama",
    show_default=True,
    help="The target's family and its recipe (qwen3: models/tiny-qwen3, gpt-oss: models/tiny-gpt-oss).",
)
def main(out: Path, overwrite: bool, target_steps: int | None, draft_steps: int | None, remeasure: bool, family: str) -> None:
    if remeasure:
        facts = remeasure_pair(out)
        acc = facts["acceptance_heldout"]
        click.echo(json.dumps({k: v["acceptance_length"] if isinstance(v, dict) and "acceptance_length" in v else v for k, v in acc.items()}, indent=1))
        return
    r = RECIPES[family]
    over = {k: v for k, v in (("target_steps", target_steps), ("draft_steps", draft_steps)) if v is not None}
    if over:
        r = Recipe(**{**asdict(r), **over})
    facts = make(out, r, overwrite, log=lambda m: click.echo(m, err=True))
    acc = facts["acceptance_heldout"][f"K={r.max_draft_len}"]
    click.echo(f"wrote {out}: acceptance length {acc['acceptance_length']:.2f} (K={r.max_draft_len}), {facts['timings']['total_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
