"""`train-draft --traffic DIR --from BUNDLE`: fine-tune a bundle's head on its captured traffic (issue 23).

1. read the capture and check it was served by this target (in bounded memory: formats/traffic_split.split_capture
   reads it once keeping a small digest per record, then reads back only the records it hands out): records
   from the --from bundle or from its lineage parent (same target by construction) are used; records
   of any other bundle are refused unless --allow-other-bundles (the user vouches that bundle served
   the same target; a prompt id outside the target's vocabulary is refused either way);
2. split it (formats/traffic_split.split_capture, split_traffic's split read in bounded memory, seeded): the held-back side is never trained on
   and is what ``gate --traffic`` measures; its digest-free description is the seed and fraction
   recorded in the child's manifest, so the gate rebuilds the same split;
3. regenerate the training prompts' responses with the target, greedy (train/regenerate.py), and
   as many general prompts (``replay_fraction`` x the traffic prompts, from the bundle's calibration
   set) beside them: on the tiny pair, 200 steps on SQL traffic alone took the build's held-out
   (Python) acceptance length from 2.39 to 1.88 (held-back SQL 1.65 -> 2.00); with half as many
   replayed prompts (the default) 2.15 (SQL 1.65 -> 1.95);
4. fine-tune the bundle's BF16 head from its weights with EAGLE-3's training-time test on
   prompt + regenerated response, soft labels from the (fake-quantized) target the bundle serves
   (train/trainer.Trainer, the hidden-state cache of train/hidden_states.py);
5. measure the acceptance length on the held-back prompts before and after (greedy speculative
   decoding, train/evaluate.measure_acceptance), write the head to ``<NEW>.head/`` and the new bundle
   to NEW (pipeline/derive.derive_bundle: same target and options, the head exported as the
   parent's draft was, manifest ``lineage`` naming the parent, the traffic digest and settings; the
   split's sides in ``traffic_split.json``, where the gate and the next retrain start from).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from eagle3_trt.atomic import make_dirs
from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.load import kv_cache_fp8, load_target, read_kv_scales
from eagle3_trt.convert.prompts import load_prompts
from eagle3_trt.convert.target import read_target
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.errors import UserError
from eagle3_trt.formats.bundle_manifest import Acceptance, Lineage
from eagle3_trt.formats.checkpoint_io import read_json
from eagle3_trt.formats.traffic import TrafficRecord
from eagle3_trt.formats.traffic_split import NEAR_DUP_JACCARD, SPLIT_SIDES_FILE, read_split_sides, split_capture
from eagle3_trt.pipeline.build_checkpoints import measure_embedded_acceptance
from eagle3_trt.pipeline.bundle import Bundle
from eagle3_trt.pipeline.derive import derive_bundle, open_parent
from eagle3_trt.train.draft_vocab import DraftVocab
from eagle3_trt.train.evaluate import measure_acceptance, torch_threads
from eagle3_trt.train.export import export_draft
from eagle3_trt.train.hidden_states import cache_key, collect, target_tokenizer
from eagle3_trt.train.progress_bars import Bars
from eagle3_trt.train.regenerate import Prompt, check_endpoint, regenerate_endpoint, regenerate_local
from eagle3_trt.train.train_draft import check_init_fits, resolve_device
from eagle3_trt.train.trainer import TargetHead, Trainer, TrainSettings

MIN_TRAIN_RECORDS = 8
FOREIGN_HINT = "capture traffic from this bundle (or its parent), or pass --allow-other-bundles if that bundle served the same target"


@dataclass
class TrafficTrainOptions:
    traffic: Path
    parent: Path
    out: Path | None = None
    seed: int = 0
    holdout_fraction: float = 0.2
    steps: int = 300
    lr: float = 1e-4
    batch_size: int = 8
    seq_len: int = 512
    gen_tokens: int = 256
    endpoint: str | None = None
    endpoint_model: str = "eagle3"
    allow_other_bundles: bool = False
    replay_fraction: float = 0.5
    min_records: int = MIN_TRAIN_RECORDS
    eval_samples: int = 16
    eval_tokens: int = 64
    device: str = "auto"
    threads: int | None = None
    overwrite: bool = False
    keep_work: bool = False
    quiet: bool = False

    def dest(self, digest: str) -> Path:
        return Path(self.out) if self.out else Path(f"{str(self.parent).rstrip('/')}-traffic-{digest[:8]}")


def prompt_sha256(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps([int(i) for i in ids]).encode("ascii")).hexdigest()


def head_dir_of(bundle: Path) -> Path:
    """Where the child's BF16 head is kept (the manifest's sources.draft.path)."""
    return Path(str(bundle).rstrip("/") + ".head")


class TrafficCheck:
    """Refuse traffic another target served, seeing each record once as the capture is read (``visit``);
    ``finish`` raises or returns warnings (records of other bundles, when allowed). The request named
    for a token id outside the vocabulary is the oldest such one."""

    def __init__(self, parent: Bundle, vocab_size: int, where: Path, allow_other: bool) -> None:
        self.parent, self.vocab_size, self.where, self.allow_other = parent, vocab_size, where, allow_other
        self.own = {parent.manifest.fingerprint}
        if parent.manifest.lineage is not None:
            self.own.add(parent.manifest.lineage.parent_fingerprint)
        self.foreign: dict[str, int] = {}
        self.records = 0
        self.bad: tuple[float, str, int] | None = None

    def visit(self, r: TrafficRecord) -> None:
        self.records += 1
        if r.bundle_fingerprint not in self.own:
            self.foreign[r.bundle_fingerprint] = self.foreign.get(r.bundle_fingerprint, 0) + 1
        bad = [i for i in r.prompt_ids + r.output_ids if not 0 <= i < self.vocab_size]
        if bad and (self.bad is None or r.time_unix < self.bad[0]):
            self.bad = (r.time_unix, r.request_id, bad[0])

    def finish(self) -> list[str]:
        if self.bad is not None:
            raise UserError(
                f"{self.where}: request {self.bad[1]}",
                f"token id {self.bad[2]} is outside the target's vocabulary ({self.vocab_size})",
                "this traffic was served by another model",
            )
        return _foreign_warnings(self.foreign, self.records, self.parent, self.where, self.allow_other)


def _foreign_warnings(foreign: dict[str, int], records: int, parent: Bundle, where: Path, allow_other: bool) -> list[str]:
    if not foreign:
        return []
    fp, n = max(foreign.items(), key=lambda kv: kv[1])
    msg = f"{sum(foreign.values())} of {records} records were served by another bundle (fingerprint {fp[:12]}..., {n} records)"
    if not allow_other:
        raise UserError(where, msg + f", not by {parent.path} (fingerprint {parent.manifest.fingerprint[:12]}...)", FOREIGN_HINT)
    return [msg + "; used because of --allow-other-bundles"]


def _prompts(train: Iterable[TrafficRecord], gen_tokens: int, seq_len: int) -> list[Prompt]:
    """One regeneration per distinct training prompt (a prompt asked many times is trained on once)."""
    seen: dict[tuple[int, ...], Prompt] = {}
    for r in train:
        key = tuple(r.prompt_ids)
        n = max(1, min(r.sampling.max_tokens, gen_tokens, seq_len - min(len(key), seq_len // 2)))
        old = seen.get(key)
        if old is None or n > old.max_tokens:
            seen[key] = Prompt(ids=list(key), text=None if r.redacted else r.prompt_text, max_tokens=n)
    return list(seen.values())


def _replay_prompts(parent: Bundle, tok, fraction: float, traffic_prompts: list[Prompt]) -> list[Prompt]:
    """General prompts mixed into the traffic (the parent's calibration set, first prompts, regenerated
    like the traffic), so the head keeps some of what it knew outside the traffic's domain."""
    n = round(fraction * len(traffic_prompts))
    f = Path(parent.manifest.calibration.file)
    if n <= 0 or not f.is_file():
        return []
    longest = max(p.max_tokens for p in traffic_prompts)
    plen = max(2, min(64, max(len(p.ids) for p in traffic_prompts)))
    texts = load_prompts(f, n, option="calibration.file")
    return [Prompt(ids=list(tok(t, add_special_tokens=True)["input_ids"])[:plen], text=None, max_tokens=longest) for t in texts]


def _served_agreement(train: Iterable[TrafficRecord], prompts: list[Prompt], replies: list[list[int]]) -> list[bool]:
    regen = {tuple(p.ids): r for p, r in zip(prompts, replies)}
    out = []
    for rec in train:
        r = regen.get(tuple(rec.prompt_ids))
        if rec.sampling.temperature == 0.0 and r is not None and rec.output_ids:
            n = min(len(r), len(rec.output_ids))
            out.append(r[:n] == rec.output_ids[:n])
    return out


def _heldout_prompts(heldout: Iterable[TrafficRecord], n: int, seed: int) -> list[list[int]]:
    uniq = sorted({tuple(r.prompt_ids) for r in heldout})
    random.Random(seed).shuffle(uniq)
    return [list(p) for p in uniq[:n]]


def train_from_traffic(o: TrafficTrainOptions) -> dict:
    with torch_threads(o.threads):
        return _train_from_traffic(o)


def _train_from_traffic(o: TrafficTrainOptions) -> dict:
    t_start = time.time()
    parent = open_parent(Path(o.parent))
    info = read_target(parent.target_dir)
    check = TrafficCheck(parent, info.vocab_size, Path(o.traffic), o.allow_other_bundles)
    # pass 1 keeps a digest of each record; split.train / split.heldout are read back from disk when iterated
    # starting from the parent's split when it was retrained on traffic too: what it trained on stays trained on
    previous = read_split_sides(parent.path / SPLIT_SIDES_FILE)
    split = split_capture(Path(o.traffic), seed=o.seed, holdout_fraction=o.holdout_fraction, previous=previous, visit=check.visit)
    warnings = check.finish()
    if len(split.train) < o.min_records:
        raise UserError(
            o.traffic,
            f"{len(split.train)} training records after holding back {len(split.heldout)} (of {split.records}); at least {o.min_records} are needed",
            "capture more traffic, or lower --holdout-fraction / --min-records",
        )
    if o.steps < 1:
        raise UserError("--steps", f"{o.steps} is not a positive number of steps")
    digest = split.train_digest()
    dest = o.dest(digest)
    head_dir = head_dir_of(dest)
    for p, what in ((dest, "bundle"), (head_dir, "head")):
        if p.exists() and not o.overwrite:
            raise UserError("-o", f"the new {what} {p} exists", "pass --overwrite or choose another -o")

    if o.endpoint:
        check_endpoint(o.endpoint, o.endpoint_model)
    device = resolve_device(o.device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    aux = tuple(parent.aux_layer_ids)
    k = parent.k
    # the BF16 head the parent serves (its draft/ when unquantized, else the source it was quantized from)
    init_dir = parent.draft_dir if parent.quant.draft == "bf16" else parent.source_dirs()[1]
    init = load_draft(init_dir)
    check_init_fits(init, info, aux)
    work = Path(str(dest).rstrip("/") + ".work")
    timings: dict[str, float] = {}
    with Bars(o.quiet) as bars:
        t = time.time()
        target = load_target(parent.target_dir, device=device, dtype=dtype, aux_layer_ids=aux)
        if kv_cache_fp8(parent.target_dir):  # as the runtime serves it (convert/load.load_engine): without
            target.kv_scales = read_kv_scales(parent.target_dir)  # them greedy replies differ from what was served
        tok = target_tokenizer(parent.target_dir)
        stop_ids = tuple(info.eos_token_ids)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        prompts = _prompts(split.train, o.gen_tokens, o.seq_len)
        replay = _replay_prompts(parent, tok, o.replay_fraction, prompts)
        adv = bars.task("regenerate responses (target, greedy)", len(prompts))
        if o.endpoint:
            replies = regenerate_endpoint(o.endpoint, o.endpoint_model, prompts, tok, on_batch=adv)
        else:
            replies = regenerate_local(target, prompts, stop_ids, pad, o.batch_size, on_batch=adv)
        if not replay:
            replay_replies: list[list[int]] = []
        elif o.endpoint:
            replay_replies = regenerate_endpoint(o.endpoint, o.endpoint_model, replay, tok)
        else:
            replay_replies = regenerate_local(target, replay, stop_ids, pad, o.batch_size)
        pairs = list(zip(prompts, replies)) + list(zip(replay, replay_replies))
        windows = [(p.ids + r)[-o.seq_len :] for p, r in pairs if len(p.ids) + len(r) >= 2]
        timings["regenerate_s"] = round(time.time() - t, 2)
        agree = _served_agreement(split.train, prompts, replies)

        t = time.time()
        seq_len = min(o.seq_len, max(len(w) for w in windows))
        make_dirs(work)
        adv = bars.task("hidden states", len(windows))
        cache = collect(target, windows, work / "cache_train", cache_key(parent.target_dir, aux, seq_len, windows), seq_len, pad, o.batch_size, on_batch=adv)
        timings["hidden_states_s"] = round(time.time() - t, 2)

        d2t = init.tensors.get("d2t")
        vocab = DraftVocab.from_d2t(d2t, info.vocab_size) if d2t is not None else DraftVocab(torch.arange(info.vocab_size), info.vocab_size)
        head = TargetHead(
            embed=target.hf.model.embed_tokens.weight.detach().to(torch.float32 if device == "cpu" else dtype),
            lm_head=target.hf.lm_head.weight.detach().to(torch.float32 if device == "cpu" else dtype),
            norm=target.hf.model.norm.weight.detach().float(),
        )
        draft = Eagle3Draft.from_checkpoint(init, dtype=torch.float32, device="cpu")
        held = _heldout_prompts(split.heldout, o.eval_samples, o.seed)

        def evaluate(label: str, d: Eagle3Draft) -> dict | None:
            if not held:
                return None
            a = bars.task(f"acceptance on held-back traffic ({label})", len(held))
            d.eval()
            rep = measure_acceptance(target, d.to(device, dtype), held, o.eval_tokens, k, stop_ids, on_prompt=lambda i: a(1))
            d.to(torch.float32)
            return rep.to_dict()

        t = time.time()
        before = evaluate("before", draft)
        timings["eval_before_s"] = round(time.time() - t, 2)

        settings = TrainSettings(steps=o.steps, batch_size=o.batch_size, lr=o.lr, max_draft_len=k, seed=o.seed, save_every=max(o.steps, 1))
        trainer = Trainer(draft, head, vocab, cache, settings, work / "ckpt", device, run_key=digest[:24])
        t = time.time()
        adv = bars.task("training", o.steps)
        trainer.train(on_step=lambda s, r: adv(1, f"loss {r['loss']:.3f}"))
        timings["train_s"] = round(time.time() - t, 2)
        draft = trainer.draft

        t = time.time()
        after = evaluate("after", draft)
        timings["eval_s"] = round(time.time() - t, 2)

    training = {
        "method": "EAGLE-3 training-time test (train/trainer.py), fine-tuned from the parent's head",
        "regenerated_by": f"endpoint {o.endpoint} ({o.endpoint_model})" if o.endpoint else "reference runtime, the bundle's target, greedy",
        "settings": asdict(settings),
        "seq_len": seq_len,
        "gen_tokens": o.gen_tokens,
        "records": split.records,
        "train_records": len(split.train),
        "train_prompts": len(prompts),
        # greedy served replies the regeneration reproduced (prefix match: max_tokens and stops may differ);
        # a shortfall means the clients got something else than the target's greedy text (sampling, another model)
        "served_greedy_compared": len(agree),
        "served_greedy_reproduced": sum(agree),
        "replay_prompts": len(replay),
        "replay_source": parent.manifest.calibration.file if replay else None,
        "regenerated_tokens": sum(len(r) for r in replies),
        "heldout_records": len(split.heldout),
        "prompt_groups": split.groups,
        "near_dup_jaccard": NEAR_DUP_JACCARD,
        "eval_prompts": len(held),
        "eval_tokens": o.eval_tokens,
        "heldout_acceptance_length_before": before["acceptance_length"] if before else None,
        "heldout_acceptance_length_after": after["acceptance_length"] if after else None,
        "final_loss": trainer.history[-1]["loss"] if trainer.history else None,
        "warnings": warnings,
    }
    report = {
        "schema": 1,
        "parent": str(parent.path),
        "bundle": str(dest),
        "head": str(head_dir),
        "traffic_digest": digest,
        "training": training,
        # what was trained on, checkable against the split (prompt_sha256 of each distinct training prompt)
        "trained_prompt_sha256": sorted(prompt_sha256(p.ids) for p in prompts),
    }
    cfg = replace(init.config, aux_layer_ids=aux)
    export_draft(
        draft, cfg, vocab, head_dir, read_json(parent.target_dir / "config.json"), {"train_report.json": json.dumps(report, indent=2) + "\n"}, overwrite=True
    )
    lineage = Lineage(
        parent_fingerprint=parent.manifest.fingerprint,
        traffic_digest=digest,
        traffic_dir=str(o.traffic),
        training=training,
        heldout_seed=o.seed,
        heldout_fraction=o.holdout_fraction,
    )
    timings["total_s"] = round(time.time() - t_start, 2)
    child = derive_bundle(parent, head_dir, dest, lineage, timings=timings, files={SPLIT_SIDES_FILE: split.sides.to_json()})
    if not o.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    report["fingerprint"] = child.manifest.fingerprint
    report["acceptance"] = child.manifest.acceptance.model_dump() if child.manifest.acceptance else None
    report["parent_acceptance"] = parent.manifest.acceptance.model_dump() if parent.manifest.acceptance else None
    # the parent on the very prompts (and K) the new bundle's figure was measured on: its manifest record may
    # come from elsewhere (recommend --write leaves the alpha report's figure there, e.g. code.jsonl)
    report["parent_acceptance_same_prompts"] = _parent_on_child_prompts(parent, child.manifest.acceptance)
    report["timings"] = timings
    return report


def _parent_on_child_prompts(parent: Bundle, child: Acceptance | None) -> dict | None:
    """The parent's acceptance on the prompts the child's was measured on (derive_bundle measures the
    child on the embedded pair's held-out prompts): the record itself when it already is that
    measurement, else measured now the same way; None when the child has no figure."""
    if child is None:
        return None
    pa = parent.manifest.acceptance
    if pa is not None and (pa.measured_on, pa.max_draft_len, pa.prompts) == (child.measured_on, child.max_draft_len, child.prompts):
        return pa.model_dump()
    tdir = Path(parent.manifest.sources.target.path)
    if not tdir.is_dir():
        return None
    again = measure_embedded_acceptance(parent.path, tdir.parent, child.max_draft_len, tuple(parent.aux_layer_ids), n_prompts=child.prompts)
    return again.model_dump() if again is not None else None


def summary_lines(report: dict) -> list[str]:
    tr = report["training"]
    lines = [
        f"traffic: {tr['records']} records, {tr['train_records']} trained on ({tr['train_prompts']} prompts regenerated: {tr['regenerated_by']}), "
        f"{tr['heldout_records']} held back",
    ]
    b, a = tr["heldout_acceptance_length_before"], tr["heldout_acceptance_length_after"]
    if a is not None:
        lines.append(
            f"held-back traffic acceptance length {b:.2f} -> {a:.2f} tokens per target forward ({tr['eval_prompts']} prompts, K={tr['settings']['max_draft_len']})"
        )
    pa, ca, same = report.get("parent_acceptance"), report.get("acceptance"), report.get("parent_acceptance_same_prompts")
    if ca and same:  # the build's own figure, on the embedded pair's held-out text (not the traffic's domain): forgetting
        lines.append(
            f"held-out prompts of the build ({ca['measured_on'].split(',')[0]}, {ca['prompts']} prompts, K={ca['max_draft_len']}): "
            f"acceptance length parent {same['acceptance_length']:.2f} -> new {ca['acceptance_length']:.2f}"
        )
    if pa and ca and (pa["measured_on"], pa["max_draft_len"], pa["prompts"]) != (ca["measured_on"], ca["max_draft_len"], ca["prompts"]):
        lines.append(
            f"(the parent's manifest figure, AL {pa['acceptance_length']:.2f}, was measured on other prompts: "
            f"{pa['measured_on'].split(',')[0]}, {pa['prompts']} prompts, K={pa['max_draft_len']}; not compared)"
        )
    lines += [f"warning: {w}" for w in tr["warnings"]]
    lines.append(f"wrote {report['bundle']} (parent {report['parent']}), head {report['head']}")
    return lines
