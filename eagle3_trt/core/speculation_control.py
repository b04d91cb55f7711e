"""TensorRT-LLM's run-time speculation controls: the draft length per batch size and the
acceptance-rate switch-off, as pure functions over counts (no model, no files).

Read in NVIDIA/TensorRT-LLM main @ 0004396720054fd8e205cbf616f21f0b57c6b412
(``tensorrt_llm/_torch/pyexecutor/py_executor.py``, ``tensorrt_llm/_torch/speculative/utils.py``,
``tensorrt_llm/_torch/speculative/speculation_gate.py``, the ``record_acceptance_rate`` version that
PR #12905 introduced with the ``acceptance_rate_*`` names):

- Draft length. ``PyExecutor._handle_dynamic_draft_len`` (one-model path) resolves, every
  iteration, ``get_draft_len_for_batch_size(draft_len_schedule, scheduled_batch.batch_size,
  max_draft_len)``: ``scheduled_batch.batch_size`` is the number of requests scheduled in that
  iteration (context and generation rows), and the rule is ``bisect_left`` over the sorted keys:
  the value of the first key >= the batch size, 0 (no drafting) above the largest key. No schedule:
  ``max_draft_len``. ``max_concurrency`` is turned into ``{max_concurrency: max_draft_len}`` by
  ``llm_args.py``.
- Switch-off. After each iteration ``PyExecutor._update_batch_acceptance_rate`` takes the
  iteration's generation rows that carried draft tokens (``num_draft_tokens > 0``, dummies left
  out) and records ONE sample, sum(accepted) / sum(drafted), in ``SpeculationGate``; an iteration
  with no drafted token records nothing. The gate keeps the last ``acceptance_rate_window_size``
  samples; once it has recorded at least that many, a window mean below
  ``acceptance_rate_threshold`` disables speculation for good, for every request of the executor
  (``speculation_permanently_disabled``; later iterations draft nothing and record nothing). So
  the window counts speculating iterations (steps of the whole batch), not requests or tokens.
- When it takes effect. ``_executor_loop`` (``disable_overlap_scheduler: true``) records the
  sample of iteration i before iteration i+1 is scheduled: i+1 no longer drafts.
  ``_executor_loop_overlap`` (TensorRT-LLM's default) schedules and launches iteration i+1 before it
  processes iteration i ("In overlap scheduler path, it will do an extra iter with spec decode
  on"): the first iteration without drafts is i+2.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


def draft_len_for_batch(schedule: Mapping[int, int] | None, batch_size: int, max_draft_len: int) -> int:
    """K TensorRT-LLM drafts in an iteration that schedules ``batch_size`` requests
    (``get_draft_len_for_batch_size``: first key >= batch size, 0 above every key)."""
    if not schedule:
        return max_draft_len
    keys = sorted(schedule)
    i = bisect.bisect_left(keys, batch_size)
    return int(schedule[keys[i]]) if i < len(keys) else 0


def schedule_from_options(schedule: Mapping[int, int] | None, max_concurrency: int | None, max_draft_len: int) -> dict[int, int] | None:
    """The schedule TensorRT-LLM runs: the options' own, or ``{max_concurrency: K}``, or None (K always)."""
    if schedule:
        return {int(b): int(k) for b, k in schedule.items()}
    if max_concurrency is not None:
        return {int(max_concurrency): int(max_draft_len)}
    return None


def iteration_rate(drafted: Sequence[int], accepted: Sequence[int]) -> float | None:
    """One iteration's sample: sum(accepted) / sum(drafted) over the rows that drafted; None when
    no row drafted (``_update_batch_acceptance_rate`` records nothing then)."""
    d = sum(int(x) for x, _ in zip(drafted, accepted, strict=True) if x > 0)
    a = sum(int(y) for x, y in zip(drafted, accepted, strict=True) if x > 0)
    return a / d if d > 0 else None


@dataclass
class SpeculationGate:
    """``SpeculationGate.record_acceptance_rate``: rolling mean of the last ``window`` samples, checked
    once ``window`` samples have been recorded; below ``threshold`` it disables for good."""

    window: int
    threshold: float
    history: deque[float] = field(default_factory=deque)
    recorded: int = 0
    disabled: bool = False

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"acceptance_rate_window_size {self.window}: must be at least 1")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"acceptance_rate_threshold {self.threshold}: must be in [0, 1]")

    def record(self, rate: float) -> bool:
        """Record one sample; True exactly when this call disables speculation."""
        if self.disabled:
            return False
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"acceptance rate {rate} is not in [0, 1]")
        self.history.append(float(rate))
        if len(self.history) > self.window:
            self.history.popleft()
        self.recorded += 1
        if self.recorded >= self.window and sum(self.history) / len(self.history) < self.threshold:
            self.disabled = True
            return True
        return False


@dataclass
class SpeculationControl:
    """What the executor decides per iteration: K from the batch size, nothing once the gate has
    tripped (one iteration later under the overlap scheduler). Iterations are numbered from 0 in
    the order they run; ``k_for`` is asked before iteration i runs, ``after`` once it has run."""

    max_draft_len: int
    schedule: dict[int, int] | None = None
    gate: SpeculationGate | None = None
    overlap_scheduler: bool = True
    max_batch_size: int | None = None  # the scheduler never schedules more requests in one iteration
    iteration: int = 0
    off_from: int | None = None  # first iteration that drafts nothing because the gate tripped
    tripped_on: int | None = None  # the iteration whose sample tripped the gate
    n_samples: int = 0  # samples the gate recorded
    # (batch size, K, draft tokens per row) of the latest iterations, in order
    rounds: deque[tuple[int, int, tuple[int, ...]]] = field(default_factory=lambda: deque(maxlen=4096))

    def k_for(self, batch_size: int) -> int:
        if self.max_batch_size is not None:
            batch_size = min(batch_size, self.max_batch_size)
        off = self.off_from is not None and self.iteration >= self.off_from
        k = 0 if off else draft_len_for_batch(self.schedule, batch_size, self.max_draft_len)
        self.rounds.append((batch_size, k, ()))
        return k

    def after(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """The iteration that just ran drafted ``drafted[i]`` and accepted ``accepted[i]`` on row i."""
        if self.rounds and not self.rounds[-1][2]:
            b, k, _ = self.rounds[-1]
            self.rounds[-1] = (b, k, tuple(int(d) for d in drafted))
        if self.gate is not None and not self.gate.disabled:
            rate = iteration_rate(drafted, accepted)
            if rate is not None:
                self.n_samples += 1
                if self.gate.record(rate):
                    self.tripped_on = self.iteration
                    self.off_from = self.iteration + (2 if self.overlap_scheduler else 1)
        self.iteration += 1

    def state(self) -> dict[str, object]:
        return {
            "iterations": self.iteration,
            "gate_samples": self.n_samples,
            "tripped_on_iteration": self.tripped_on,
            "speculation_off_from_iteration": self.off_from,
            "schedule": self.schedule,
            "overlap_scheduler": self.overlap_scheduler,
        }
