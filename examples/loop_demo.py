"""The traffic loop on the embedded tiny pair, on CPU: ``make loop-demo`` (issue 23 F).

serve with capture on -> drive traffic from a domain the head never saw -> measure it -> retrain
the head on it -> gate -> drive new traffic of the same kind -> deploy the new head as the next model version
while serving -> drive that traffic again -> served acceptance length before and after the
deploy, from the capture records.

Every step is an ``eagle3-trt`` command, printed before it runs, so the demo doubles as a recipe.
The traffic is SQL (examples/traffic_domain.jsonl); the tiny head was trained on Python source.
The first 192 prompts are phase 1 (captured, trained on, gated on), the last 64 are phase 2
(never trained on). Ports, the work directory and sizes are options (see --help).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from eagle3_trt.clients.llm_client import GenerationParams, LLMClient
from eagle3_trt.formats.traffic import TrafficRecord, read_traffic
from eagle3_trt.measure.traffic_gate import verdict_line

HERE = Path(__file__).resolve().parent
PROMPTS = HERE / "traffic_domain.jsonl"
EXE = str(Path(sys.executable).with_name("eagle3-trt"))


def sh(*args: str, ok: tuple[int, ...] = (0,)) -> int:
    print("\n$ eagle3-trt " + " ".join(args), flush=True)
    rc = subprocess.call([EXE, *args])
    if rc not in ok:
        sys.exit(f"loop-demo: `eagle3-trt {args[0]}` exited {rc}")
    return rc


def drive(grpc_url: str, prompts: list[str], max_tokens: int, concurrency: int) -> None:
    """Greedy streaming requests, `concurrency` at a time, through the project's gRPC client."""
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0)

    def one(p: str) -> str | None:
        with LLMClient(grpc_url) as c:
            return c.generate(p, params, stream=True).finish_reason

    # a line every eighth of the requests: 192 requests take a minute or two on a CPU, and a silent
    # terminal for that long looks hung
    t0, every = time.monotonic(), max(1, len(prompts) // 8)
    with ThreadPoolExecutor(concurrency) as ex:
        futures = [ex.submit(one, p) for p in prompts]
        for done, _ in enumerate(as_completed(futures), 1):
            if done % every == 0 and done < len(prompts):
                print(f"  {done}/{len(prompts)} answered ({time.monotonic() - t0:.0f} s)", flush=True)
        reasons = [f.result() for f in futures]
    print(f"  sent {len(prompts)} requests ({concurrency} at a time): finish reasons {sorted(set(map(str, reasons)))}", flush=True)


def served_al(recs: list[TrafficRecord]) -> tuple[float, int]:
    """Acceptance length over requests, as the server counted it: tokens / target forwards."""
    toks = sum(r.acceptance.completion_tokens for r in recs)
    fwd = sum(r.acceptance.target_forwards for r in recs)
    return (toks / fwd if fwd else 0.0), len(recs)


def plot_served_al(figures: dict[str, tuple[float, int]], dest: Path) -> Path:
    """A bar per model version: the served AL on the phase-2 prompts (docs/traffic-loop.md shows one)."""
    import matplotlib  # imported here: only the demo's last step draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    labels = [f"version {v}\n({'before' if v == '1' else 'after'} deploy)" for v in figures]
    bars = ax.bar(labels, [al for al, _ in figures.values()], color=["#9e9e9e", "#1f77b4"][: len(figures)])
    for b, (al, n) in zip(bars, figures.values()):
        ax.annotate(f"AL {al:.2f}\n({n} requests)", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("served acceptance length\n(tokens per target forward)")
    ax.set_title("the same new SQL prompts, before and after the new head", fontsize=9)
    ax.set_ylim(0, max(al for al, _ in figures.values()) * 1.3)
    fig.tight_layout()
    fig.savefig(dest, dpi=120)
    plt.close(fig)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("loop-demo"), help="work directory (replaced)")
    ap.add_argument("--http-port", type=int, default=8100)
    ap.add_argument("--grpc-port", type=int, default=8101)
    ap.add_argument("--metrics-port", type=int, default=8102)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200, help="fine-tuning steps")
    ap.add_argument("--lr", default="3e-4", help="fine-tuning learning rate")
    a = ap.parse_args()

    rows = [json.loads(line) for line in PROMPTS.read_text(encoding="utf-8").splitlines() if line.strip()]
    phase1, phase2 = [r["text"] for r in rows[:192]], [r["text"] for r in rows[192:]]
    w = a.work.resolve()
    if w.exists():
        shutil.rmtree(w)
    w.mkdir(parents=True)
    old, new, repo, traffic, state = w / "bundle-v1", w / "bundle-v2", w / "repo", w / "traffic", w / "serve"
    grpc = f"127.0.0.1:{a.grpc_port}"

    sh("engine", "--model", "tiny", "-o", str(old))
    sh("package", str(old), "-o", str(repo))
    ports = ["--http-port", str(a.http_port), "--grpc-port", str(a.grpc_port), "--metrics-port", str(a.metrics_port)]
    sh("serve", str(repo), *ports, "--state-dir", str(state), "--capture", str(traffic))
    try:
        print(f"\n# phase 1: {len(phase1)} SQL requests to version 1 (its head was trained on Python)", flush=True)
        drive(grpc, phase1, a.max_tokens, a.concurrency)
        # the capturer flushes every 0.5 s; the alpha/train/gate steps read what is on disk
        time.sleep(1.5)
        sh("alpha", str(old), "--traffic", str(traffic))
        sh("train-draft", "--traffic", str(traffic), "--from", str(old), "-o", str(new), "--steps", str(a.steps), "--lr", a.lr, "--threads", "1")
        gate_rc = sh("gate", str(new), "--against", str(old), "--traffic", str(traffic), "--json-out", str(w / "gate.json"), ok=(0, 3))
        if gate_rc != 0:
            sys.exit("\nloop-demo: the gate did not pass, so version 2 is not deployed (that is the gate's job)")
        print(f"\n# phase 2, before: {len(phase2)} new SQL requests (never trained on), served by version 1", flush=True)
        drive(grpc, phase2, a.max_tokens, a.concurrency)
        sh("deploy", str(new), "--repo", str(repo), "--state-dir", str(state))
        print(f"\n# phase 2, after: the same {len(phase2)} requests, served by version 2", flush=True)
        drive(grpc, phase2, a.max_tokens, a.concurrency)
    finally:
        sh("stop", "--state-dir", str(state), ok=(0, 1))
    recs = read_traffic(traffic)
    phase2_ids = {tuple(r.prompt_ids) for r in recs[len(phase1) :]}
    by_version: dict[str, list[TrafficRecord]] = {}
    for r in recs:
        if tuple(r.prompt_ids) in phase2_ids:
            by_version.setdefault(str(r.model_version), []).append(r)
    print("\n# served acceptance length on the phase-2 prompts (capture records, as the server counted):")
    figures = {v: served_al(by_version[v]) for v in sorted(by_version)}
    for v, (al, n) in figures.items():
        print(f"  version {v} ({'before' if v == '1' else 'after'} the deploy): AL {al:.3f} over {n} requests")
    print(f"  chart: {plot_served_al(figures, w / 'served_al.png')}")
    print("\n" + verdict_line(json.loads((w / "gate.json").read_text())))


if __name__ == "__main__":
    main()
