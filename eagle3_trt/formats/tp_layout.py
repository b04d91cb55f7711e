"""How a decoder config's attention heads and MLP split over tensor-parallel ranks (arithmetic on
config.json fields, no torch: the planner sizes a measurement with it before anything loads, and
core/tensor_parallel.py slices the weights with it)."""

from __future__ import annotations

from typing import Any

from eagle3_trt.errors import UserError


def even_split(n: int, world: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of ``rank``'s contiguous block of ``n`` items (the first ranks one larger)."""
    base, extra = divmod(n, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def head_ranges(n_heads: int, n_kv: int, world: int, rank: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """((q_lo, q_hi), (kv_lo, kv_hi)): the query and KV heads ``rank`` holds.

    The ranks either divide the KV heads (each rank n_kv / world of them with their query heads)
    or are divided by them (world / n_kv ranks share a KV head, replicated, and split its query
    heads, the first ones one larger: Megatron-LM's rule for tp > num_key_value_heads)."""
    group = n_heads // n_kv
    if n_kv % world == 0:
        per = n_kv // world
        return (rank * per * group, (rank + 1) * per * group), (rank * per, (rank + 1) * per)
    if world % n_kv == 0 and group >= world // n_kv:
        share = world // n_kv
        kv, part = divmod(rank, share)
        lo, hi = even_split(group, share, part)
        return (kv * group + lo, kv * group + hi), (kv, kv + 1)
    raise UserError(
        "--tp",
        f"{world} ranks cannot split {n_heads} attention heads over {n_kv} KV heads",
        "use a TP size that divides the KV heads, or a multiple of them up to the query heads per KV head",
    )


def heads_of(cfg: dict[str, Any]) -> tuple[int, int, int]:
    """(query heads, KV heads, head_dim) of a decoder config."""
    n_heads = int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads") or n_heads)
    return n_heads, n_kv, int(cfg.get("head_dim") or int(cfg["hidden_size"]) // n_heads)


def refuse_unsplittable(cfg: dict[str, Any], world: int) -> None:
    """One line for a target the reference runtime does not split (mixture-of-experts layers)."""
    if world > 1 and any(cfg.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        raise UserError(
            "--tp",
            f"the reference runtime splits dense decoders over ranks; this target's layers are mixture-of-experts ({world} ranks asked)",
            "measure it on one device (--tp 1)",
        )


def local_config(cfg: dict[str, Any], world: int, rank: int) -> dict[str, Any]:
    """The config of ``rank``'s slice: its head counts and intermediate size (head_dim made explicit)."""
    refuse_unsplittable(cfg, world)
    n_heads, n_kv, head_dim = heads_of(cfg)
    (q0, q1), (k0, k1) = head_ranges(n_heads, n_kv, world, rank)
    i0, i1 = even_split(int(cfg["intermediate_size"]), world, rank)
    return {**cfg, "num_attention_heads": q1 - q0, "num_key_value_heads": k1 - k0, "intermediate_size": i1 - i0, "head_dim": head_dim}
