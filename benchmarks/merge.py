"""Merge a partial run's report into docs/benchmarks.md (``python -m benchmarks --only X --merge``).

A full run takes long (the far regions alone half an hour); a change that moves
one figure re-runs that benchmark. Its summary rows, section and analysis then
replace those in the doc, the sections are numbered again in the order of
``BENCHMARKS``, and the machine table's "re-run" row says which come from which run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Report", "merge"]

_SECTION = re.compile(r"^## (\d+)\. (.+)$")
_SUMMARY_ROW = re.compile(r"^\| (?:(\d+)\. (.+?))? \| (.*)$")
MISSES = "## Misses: where the time goes"
RERUN = "| re-run | "


@dataclass
class Report:
    """docs/benchmarks.md taken apart by benchmark title."""

    preamble: list[str]  # up to the summary table's rows: title, machine, summary header
    rows: dict[str, list[str]] = field(default_factory=dict)  # title -> "figure | ... |" rows
    sections: dict[str, list[str]] = field(default_factory=dict)  # title -> lines after "## N."
    misses: dict[str, list[str]] = field(default_factory=dict)  # title -> "### title: ..." on

    @classmethod
    def parse(cls, text: str, titles: Sequence[str]) -> Report:
        lines = text.rstrip("\n").split("\n")
        start = lines.index("## Summary") + 4  # heading, blank, header row, rule
        report = cls(lines[:start])
        at = start
        title = ""
        while at < len(lines) and lines[at].startswith("|"):
            found = _SUMMARY_ROW.match(lines[at])
            if found is None:
                raise ValueError(f"not a summary row: {lines[at]!r}")
            title = found.group(2) or title
            report.rows.setdefault(title, []).append(found.group(3))
            at += 1
        current: list[str] | None = None
        for line in lines[at:]:
            section = _SECTION.match(line)
            if section is not None:
                current = report.sections.setdefault(section.group(2), [])
                continue
            if line == MISSES:
                current = None
                continue
            if line.startswith("### "):
                title = next((t for t in titles if line.startswith(f"### {t}: ")), "")
                if not title:
                    raise ValueError(f"an analysis of no known benchmark: {line!r}")
                current = report.misses.setdefault(title, [])
            if current is not None:
                current.append(line)
        return report

    def render(self, titles: Sequence[str]) -> str:
        present = [t for t in titles if t in self.sections]
        lines = list(self.preamble)
        for n, title in enumerate(present, 1):
            for i, row in enumerate(self.rows.get(title, [])):
                lines.append(f"| {f'{n}. {title}' if i == 0 else ''} | {row}")
        for n, title in enumerate(present, 1):
            lines += ["", f"## {n}. {title}", *_trimmed(self.sections[title])]
        missed = [t for t in present if t in self.misses]
        if missed:
            lines += ["", MISSES]
            for title in missed:
                lines += _trimmed(self.misses[title])
        return "\n".join(lines).rstrip() + "\n"


def merge(doc: str, partial: str, titles: Sequence[str], note: str) -> str:
    """doc with the benchmarks of partial (a report of the same format) in place of its
    own; note goes first into the machine table's re-run row."""
    merged, new = Report.parse(doc, titles), Report.parse(partial, titles)
    for title in new.sections:
        merged.sections[title] = new.sections[title]
        merged.rows[title] = new.rows.get(title, [])
        if title in new.misses:
            merged.misses[title] = new.misses[title]
        else:
            merged.misses.pop(title, None)
    rerun = next((i for i, line in enumerate(merged.preamble) if line.startswith(RERUN)), None)
    if rerun is None:
        total = next(i for i, line in enumerate(merged.preamble) if line.startswith("| total"))
        merged.preamble.insert(total + 1, f"{RERUN}{note}; the other sections are those of "
                                          "the full run |")  # fmt: skip
    else:
        merged.preamble[rerun] = f"{RERUN}{note}; {merged.preamble[rerun][len(RERUN) :]}"
    return merged.render(titles)


def _trimmed(lines: list[str]) -> list[str]:
    """lines without the blank lines at either end, after one blank line."""
    start, end = 0, len(lines)
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return ["", *lines[start:end]] if start < end else []
