"""Captured traffic made of token-id prompts, as a Dynamo worker stores it (no prompt text).

One writer for the tests and benchmarks that need a capture directory of given prompts: every record
served speculatively with the same figures, times one second apart.
"""

from __future__ import annotations

from pathlib import Path

from eagle3_trt.formats.traffic import CapturedSampling, SegmentWriter, ServedAcceptance, TrafficRecord


def write_id_capture(
    dirpath: Path, prompts: list[list[int]], *, fingerprint: str = "f" * 64, segment_records: int = 2048, time0: float = 1.7e9
) -> SegmentWriter:
    """Write one record per prompt; the caller flushes or closes the returned writer."""
    w = SegmentWriter(dirpath, segment_records=segment_records)
    acc = ServedAcceptance(speculative=True, draft_tokens=9, accepted_draft_tokens=5, target_forwards=4, completion_tokens=9)
    for i, p in enumerate(prompts):
        w.write(
            TrafficRecord(
                request_id=f"r{i}",
                time_unix=time0 + i,
                bundle_fingerprint=fingerprint,
                model="eagle3",
                frontend="triton",
                chat=False,
                prompt_text=None,
                prompt_ids=p,
                output_ids=[1] * 9,
                finish_reason="length",
                sampling=CapturedSampling(max_tokens=9),
                acceptance=acc,
            )
        )
    return w
