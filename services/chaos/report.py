"""What a chaos run reports: one row per scenario, printed as a table and written as JSON."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import msgspec

from services.chaos.load import Outcome, Verdict


class ScenarioResult(msgspec.Struct, kw_only=True):
    scenario: str
    target: str = ""  # the instance (or server) the fault hit
    sent: int = 0
    correct: int = 0
    clear_errors: int = 0
    hung: int = 0
    wrong: int = 0
    leaked_pages: int = 0
    recovery_s: float | None = None  # fault -> every instance ready again and a probe answered right (None: never)
    slowest_after_fault_s: float = 0.0  # longest wait for an answer of a request in flight at or sent after it
    answer_within_s: float | None = None  # the target for slowest_after_fault_s (hang scenarios), else None
    skipped: str = ""  # why the scenario did not run
    strict: bool = False  # no fault but the requests: a clear error fails the scenario too
    errors: dict[str, int] = msgspec.field(default_factory=dict)  # clear errors and wrong answers, by message

    @property
    def ok(self) -> bool:
        if self.skipped:
            return True
        late = self.answer_within_s is not None and self.slowest_after_fault_s > self.answer_within_s
        refused = self.strict and self.clear_errors
        return not (self.wrong or self.hung or self.leaked_pages or late or refused or self.recovery_s is None)


class ChaosReport(msgspec.Struct, kw_only=True):
    cluster: str
    seed: int
    duration_s: float
    concurrency: int
    max_tokens: int
    scenarios: list[ScenarioResult]
    baseline_median_s: float = 0.0  # a request alone on the healthy cluster, for scale

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.scenarios)


def tally(result: ScenarioResult, outcomes: Sequence[Outcome], fault_at: float | None) -> ScenarioResult:
    kinds = Counter(o.verdict for o in outcomes)
    result.sent = len(outcomes)
    result.correct, result.clear_errors = kinds[Verdict.CORRECT], kinds[Verdict.CLEAR]
    result.hung, result.wrong = kinds[Verdict.HUNG], kinds[Verdict.WRONG]
    details = Counter(o.detail for o in outcomes if o.verdict != Verdict.CORRECT)
    result.errors = dict(details.most_common(8))
    if fault_at is not None:
        waits = [o.ended - max(o.started, fault_at) for o in outcomes if o.ended >= fault_at]
        result.slowest_after_fault_s = round(max(waits, default=0.0), 2)
    return result


_COLUMNS = (
    "scenario",
    "target",
    "sent",
    "correct",
    "clear err",
    "hung",
    "wrong",
    "leaked",
    "recovery s",
    "slowest s",
    "result",
)


def format_table(report: ChaosReport) -> str:
    rows = [_COLUMNS]
    for s in report.scenarios:
        if s.skipped:
            rows.append((s.scenario, "-", "-", "-", "-", "-", "-", "-", "-", "-", f"skipped: {s.skipped}"))
            continue
        rec = f"{s.recovery_s:.1f}" if s.recovery_s is not None else "never"
        slow = f"{s.slowest_after_fault_s:.1f}" + (f" (<= {s.answer_within_s:.0f})" if s.answer_within_s else "")
        rows.append(
            (
                s.scenario,
                s.target,
                str(s.sent),
                str(s.correct),
                str(s.clear_errors),
                str(s.hung),
                str(s.wrong),
                str(s.leaked_pages),
                rec,
                slow,
                "ok" if s.ok else "FAIL",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS) - 1)]
    lines = [
        f"pdrelay chaos: cluster '{report.cluster}', seed {report.seed}, {report.duration_s:.0f} s per "
        f"scenario, {report.concurrency} clients, {report.max_tokens} greedy tokens per request (healthy: "
        f"{report.baseline_median_s:.2f} s each, one at a time)"
    ]
    lines += ["  ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths)), r[-1]]) for r in rows]
    for s in report.scenarios:
        for msg, n in s.errors.items():
            lines.append(f"  {s.scenario}: {n} x {msg}")
    lines.append(
        "result: "
        + (
            "every scenario: 0 wrong, 0 hung, 0 leaked pages, recovered"
            if report.ok
            else "FAILED (see the rows marked FAIL)"
        )
    )
    return "\n".join(lines)
