import torch

from eagle3_trt.convert import modelopt_compat
from eagle3_trt.core.nvfp4 import E2M1_MAX, nvfp4_fake_quant, round_to_e2m1


def test_e2m1_grid_and_ties_to_even():
    x = torch.tensor([0.1, 0.25, 0.3, 0.75, 1.2, 1.25, 1.75, 2.4, 2.5, 3.5, 5.0, 5.1, 100.0, -0.75, -5.0])
    want = torch.tensor([0.0, 0.0, 0.5, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -1.0, -4.0])
    assert torch.equal(round_to_e2m1(x), want)


def test_fake_quant_is_idempotent_and_bounded():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 64, generator=g)
    amax = w.abs().max()
    q = nvfp4_fake_quant(w, 16, amax)
    assert torch.allclose(nvfp4_fake_quant(q, 16, amax), q)
    blocks = w.reshape(-1, 16)
    err = (q.reshape(-1, 16) - blocks).abs().amax(-1)
    assert bool((err <= blocks.abs().amax(-1) / E2M1_MAX * 1.0 * 1.07 + blocks.abs().amax(-1) * 2**-3).all())
    # at most 8 distinct magnitudes per block
    assert all(torch.unique(b.abs()).numel() <= 8 for b in q.reshape(-1, 16))


def test_nvfp4_forward_after_quantize_runs_on_cpu():
    assert modelopt_compat.install_cpu_workarounds() and modelopt_compat.install_cpu_workarounds()  # idempotent
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    x = torch.randn(8, 64)
    ref = net(x)
    modelopt_compat.quantize(net, modelopt_compat.format_config("nvfp4"), lambda m: m(x))
    out = net(x)
    assert out.shape == ref.shape and not torch.equal(out, ref)  # fake quant did something
    assert torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0) > 0.95


def test_fp4_capability_probe_is_guarded_on_cpu():
    # ModelOpt 0.37's fp4_compatible() calls torch.cuda.get_device_capability(0) unguarded; after the
    # workarounds the NVFP4 exporter's copy of it answers False on a CPU-only torch instead of raising.
    from modelopt.torch.quantization.qtensor import nvfp4_tensor

    modelopt_compat.install_cpu_workarounds()
    if not torch.cuda.is_available():
        assert nvfp4_tensor.fp4_compatible() is False
