"""Read the model's speculative-decoding counters from Triton's Prometheus endpoint.

Only the text exposition format Triton writes is handled (``name{l="v",...} value``).
"""

from __future__ import annotations

import re
import time
import urllib.request
from dataclasses import dataclass, field

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_text(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(3) or "")))
        try:
            out[(m.group(1), labels)] = float(m.group(4))
        except ValueError:
            continue
    return out


def scrape(url: str, timeout_s: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return parse_text(r.read().decode("utf-8", "replace"))


@dataclass
class SpecCounters:
    """The eagle3_* metrics of one model at one moment (or the difference of two)."""

    requests: dict[str, float] = field(default_factory=dict)  # by status
    tokens_on: float = 0.0
    tokens_off: float = 0.0
    draft: float = 0.0
    accepted: float = 0.0
    al_sum: float = 0.0
    al_count: float = 0.0
    drafted_pos: dict[int, float] = field(default_factory=dict)
    accepted_pos: dict[int, float] = field(default_factory=dict)
    spec_off_requests: float = 0.0
    active: float = 0.0

    @classmethod
    def from_samples(cls, samples: dict, model: str) -> SpecCounters:
        c = cls()
        for (name, labels), v in samples.items():
            lab = dict(labels)
            if lab.get("model") != model or not name.startswith("eagle3_"):
                continue
            if name == "eagle3_requests_total":
                c.requests[lab.get("status", "")] = v
            elif name == "eagle3_generated_tokens_total":
                if lab.get("speculation") == "on":
                    c.tokens_on = v
                else:
                    c.tokens_off = v
            elif name == "eagle3_draft_tokens_total":
                c.draft = v
            elif name == "eagle3_accepted_draft_tokens_total":
                c.accepted = v
            elif name == "eagle3_acceptance_length_sum":
                c.al_sum = v
            elif name == "eagle3_acceptance_length_count":
                c.al_count = v
            elif name == "eagle3_drafted_tokens_by_position_total":
                c.drafted_pos[int(lab["position"])] = v
            elif name == "eagle3_accepted_tokens_by_position_total":
                c.accepted_pos[int(lab["position"])] = v
            elif name == "eagle3_requests_speculation_off_total":
                c.spec_off_requests = v
            elif name == "eagle3_active_requests":
                c.active = v
        return c

    def minus(self, before: SpecCounters) -> SpecCounters:
        return SpecCounters(
            {k: v - before.requests.get(k, 0.0) for k, v in self.requests.items()},
            self.tokens_on - before.tokens_on,
            self.tokens_off - before.tokens_off,
            self.draft - before.draft,
            self.accepted - before.accepted,
            self.al_sum - before.al_sum,
            self.al_count - before.al_count,
            {k: v - before.drafted_pos.get(k, 0.0) for k, v in self.drafted_pos.items()},
            {k: v - before.accepted_pos.get(k, 0.0) for k, v in self.accepted_pos.items()},
            self.spec_off_requests - before.spec_off_requests,
            self.active,
        )

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.draft if self.draft else None

    @property
    def acceptance_length(self) -> float | None:
        """Mean tokens per verification step (accepted drafts + 1)."""
        return self.al_sum / self.al_count if self.al_count else None

    def acceptance_by_position(self) -> list[float]:
        """Cumulative acceptance at each draft position: P(positions 1..k all accepted)."""
        return [self.accepted_pos.get(k, 0.0) / d if d else 0.0 for k, d in sorted(self.drafted_pos.items())]


def read_counters(url: str, model: str) -> SpecCounters:
    return SpecCounters.from_samples(scrape(url), model)


def _ended_requests(c: SpecCounters) -> float:
    """Requests the model has counted as ended, whatever their outcome (rejections included)."""
    return sum(c.requests.values())


def settled_counters(url: str, model: str, before: SpecCounters, ended: int, timeout_s: float = 20.0) -> tuple[SpecCounters, bool]:
    """The counters once ``ended`` more requests than in ``before`` have been counted as ended.

    The model updates its metrics off the request path and counts a request's outcome after its
    tokens and acceptance figures, so a response can reach the client before its figures reach
    the metrics port. Returns the counters read last and whether they settled within ``timeout_s``.
    """
    end = time.monotonic() + timeout_s
    while True:
        now = read_counters(url, model)
        done = _ended_requests(now) - _ended_requests(before) >= ended
        if done or time.monotonic() > end:
            return now, done
        time.sleep(0.05)
