"""``python -m benchmarks --only X --merge``: a partial run's sections replace the doc's."""

from __future__ import annotations

from benchmarks.common import Check, Result
from benchmarks.merge import Report, merge
from benchmarks.report import markdown

TITLES = ["First", "Second", "Third"]
MACHINE = [("date", "2026-12-02 09:00 UTC"), ("revision", "abc1234")]


def report(*results: Result) -> str:
    return markdown(results, MACHINE, quick=False, total_s=1.0, command="python -m benchmarks")


def result(title: str, measured: str, ok: bool, analysis: str = "") -> Result:
    return Result(title.lower(), title, f"How {title} is measured.",
                  checks=[Check(f"{title} p99", measured, "≤ 1", ok)], analysis=analysis)  # fmt: skip


def test_a_report_parses_and_renders_back_unchanged() -> None:
    doc = report(result("First", "1", True), result("Second", "3", False, "Why."),
                 result("Third", "0.5", True))  # fmt: skip
    assert Report.parse(doc, TITLES).render(TITLES) == doc


def test_a_partial_run_replaces_its_sections_and_adds_new_ones_in_order() -> None:
    doc = report(result("First", "1", True), result("Third", "2", False, "Slow disk."))
    partial = report(result("Third", "0.5", True), result("Second", "0.9", True))

    merged = merge(doc, partial, TITLES, "Third, Second at 09:00")

    assert merged == report(
        result("First", "1", True), result("Second", "0.9", True), result("Third", "0.5", True)
    ).replace("| total run time | 1 s |",
              "| total run time | 1 s |\n| re-run | Third, Second at 09:00; the other "
              "sections are those of the full run |")  # fmt: skip
    assert "Slow disk." not in merged  # the miss it explained is gone
    again = merge(merged, report(result("First", "2", False, "Noise.")), TITLES, "First later")
    assert "| re-run | First later; Third, Second at 09:00; the other" in again
    assert "## Misses: where the time goes" in again and "Noise." in again
    assert again.index("## 1. First") < again.index("## 2. Second") < again.index("## 3. Third")
