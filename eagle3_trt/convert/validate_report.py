"""The report validation fills: passed checks with their details, and warnings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ValidationReport:
    checks: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    aux_layer_ids: tuple[int, ...] = ()
    aux_layers_are_default: bool = True

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
        }
