"""The Triton model's Prometheus metrics when the metrics thread sums several finished requests into
one update per metric (issue 32): after concurrent streams end together, every counter moved by
exactly what the responses themselves reported, speculation on and off per request."""

from __future__ import annotations

import concurrent.futures as cf

import pytest

PROMPTS = ["What is the capital of France?", "Write a short poem about the ocean.", "Explain what a hash table is.", "Give three tips for clean code."]


@pytest.fixture(scope="module")
def server(fp8_bundle, tmp_path_factory):
    from eagle3_trt.triton_serving.package import package_bundle
    from eagle3_trt.triton_serving.server import free_ports, start_server, stop_server

    tmp = tmp_path_factory.mktemp("metrics")
    package_bundle(fp8_bundle, tmp / "repo", torch_threads=1, with_baseline=True)
    h, g, m = free_ports(3)
    s = start_server(tmp / "repo", state_dir=tmp / "state", http_port=h, grpc_port=g, metrics_port=m, timeout_s=300)
    yield s
    stop_server(s)


def _counters(server):
    from eagle3_trt.clients.prom import read_counters

    return read_counters(server.metrics_url, "eagle3")


@pytest.mark.needs("tritonserver", "tritonclient")
def test_summed_metrics_equal_what_the_responses_reported(server, fp8_bundle):
    from eagle3_trt.clients.chat import PromptFormatter
    from eagle3_trt.clients.llm_client import GenerationParams, LLMClient
    from eagle3_trt.clients.prom import settled_counters

    fmt = PromptFormatter(fp8_bundle)
    jobs = [(fmt(PROMPTS[i % 4]), i % 2 == 0) for i in range(8)]  # 4 with speculation, 4 without
    before = _counters(server)

    def run(job):
        text, spec = job
        with LLMClient(server.grpc_url, timeout_s=120) as c:
            return spec, c.generate(text, GenerationParams(max_tokens=12, speculative=spec), stream=True)

    with cf.ThreadPoolExecutor(len(jobs)) as ex:
        results = list(ex.map(run, jobs))
    # The metrics thread counts a request's outcome after its figures: once all 8 are counted as
    # ended, every other counter has its final value (this read raced the figures before).
    after, settled = settled_counters(server.metrics_url, "eagle3", before, len(jobs))
    assert settled, after
    d = after.minus(before)

    on = [r for spec, r in results if spec]
    off = [r for spec, r in results if not spec]
    assert d.requests.get("ok", 0) == len(jobs) and d.active == 0, d
    assert d.tokens_on == sum(r.n_tokens for r in on) and d.tokens_off == sum(r.n_tokens for r in off), d
    assert d.spec_off_requests == len(off), d
    assert all(r.perf["speculative_decoding"] for r in on) and not any(r.perf["speculative_decoding"] for r in off)
    assert d.draft == sum(r.perf["total_draft_tokens"] for r in on) > 0, d
    assert d.accepted == sum(r.perf["total_accepted_draft_tokens"] for r in on), d
    # per-step figures: every verification step drafted position 1 and adds one observation of
    # (accepted drafts + 1) to the histogram; the accepted drafts by position add up to the total
    assert d.al_count == d.drafted_pos.get(1, 0) > 0, d
    assert sum(d.accepted_pos.values()) == d.accepted, d
    assert d.al_sum == d.accepted + d.al_count, d


@pytest.mark.needs("tritonserver", "tritonclient")
def test_bench_against_the_baseline_model_reads_the_speculative_models_counters(server, fp8_bundle):
    """bench --baseline-model: the off arm runs on eagle3_nospec, which moves none of eagle3's counters,
    so only the speculative arm waits for them (an off arm that waited would time out and say it missed requests)."""
    from eagle3_trt.clients.bench import BenchConfig, run_bench
    from eagle3_trt.clients.chat import PromptFormatter

    fmt = PromptFormatter(fp8_bundle)
    logs: list[str] = []
    cfg = BenchConfig(
        url=server.grpc_url,
        model="eagle3",
        prompts=[fmt(p) for p in PROMPTS],
        concurrency=[2],
        max_tokens=8,
        requests_per_level=2,
        warmup=1,
        metrics_url=server.metrics_url,
        baseline_model="eagle3_nospec",
        timeout_s=120,
    )
    run = run_bench(cfg, log=logs.append)
    assert not [m for m in logs if "counted fewer" in m], logs
    on, off = run.arms
    recs = [r for r in run.records if r.speculative]
    assert on.speculative and not off.speculative and all(r.ok for r in run.records)
    assert on.alpha_metrics == sum(r.accepted_tokens or 0 for r in recs) / sum(r.draft_tokens or 0 for r in recs)
    assert off.alpha_metrics is None and not any(r.served_speculative for r in run.records if not r.speculative)
