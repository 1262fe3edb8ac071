"""A figure: one ratio or count from one run, its target, and the absolute numbers beside it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Op = Literal["<=", ">=", "=="]


@dataclass
class Figure:
    """One benchmark figure.

    ``value`` is judged against ``target`` with ``op`` (no target: reported only).
    ``safety`` figures (windows over the limit, lost or duplicated mail) make
    the bench command exit non-zero when they miss; the others are reported.
    ``detail`` holds the absolute numbers behind the figure, never judged.
    """

    key: str
    title: str
    value: float | None
    unit: str = ""
    op: Op | None = None
    target: float | None = None
    safety: bool = False
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def met(self) -> bool | None:
        if self.op is None or self.target is None:
            return None
        if self.value is None or math.isnan(self.value):
            return False
        if self.op == "<=":
            return self.value <= self.target
        if self.op == ">=":
            return self.value >= self.target
        return self.value == self.target

    @property
    def verdict(self) -> str:
        met = self.met
        if met is None:
            return "reported"
        if met:
            return "meets"
        return "FAILS" if self.safety else "misses"

    def target_text(self) -> str:
        if self.op is None or self.target is None:
            return "—"
        op = {"<=": "≤", ">=": "≥", "==": "="}[self.op]
        return f"{op} {fmt(self.target)}{self.unit}"

    def value_text(self) -> str:
        return "n/a" if self.value is None else f"{fmt(self.value)}{self.unit}"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["met"] = self.met
        out["verdict"] = self.verdict
        return out


def fmt(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    if value == int(value) and abs(value) < 1e12:
        return str(int(value))
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"


def table(figures: list[Figure]) -> str:
    """A plain-text table for the terminal."""
    rows = [("figure", "value", "target", "verdict")]
    rows += [(f.title, f.value_text(), f.target_text(), f.verdict) for f in figures]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(figures: list[Figure]) -> str:
    lines = ["| figure | value | target | verdict | absolute numbers (not judged) |", "|---|---|---|---|---|"]
    for f in figures:
        detail = f.detail.replace("|", "\\|").replace("\n", "<br>")
        lines.append(f"| {f.title} | {f.value_text()} | {f.target_text()} | {f.verdict} | {detail} |")
    return "\n".join(lines)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
