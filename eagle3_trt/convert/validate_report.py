"""The report validation fills: passed checks with their details, and warnings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ValidationReport:
    checks: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    aux_layer_ids: tuple[int, ...] = ()
    aux_layers_are_default: bool = True
    # convert/behaviour.py's measured figures (target loss vs log V, draft agreement vs chance), or
    # {"skipped": why} where they were not measured (a dry run reads no weights)
    behaviour: dict | None = None

    def ok(self, name: str, detail: str) -> None:
        self.checks.append({"check": name, "ok": True, "detail": detail})

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)

    def to_dict(self) -> dict:
        return {
            "checks": self.checks,
            "warnings": self.warnings,
            "aux_layer_ids": list(self.aux_layer_ids),
            "aux_layers_are_default": self.aux_layers_are_default,
            **({"behaviour": self.behaviour} if self.behaviour is not None else {}),
        }
