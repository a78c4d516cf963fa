"""``python -m benchmarks [--quick] [--only NAME] [--output FILE]``.

Runs the benchmarks, prints each as tables, and writes docs/benchmarks.md after
a full run of all of them (a quick or partial run writes only with --output).
Exits 1 if a benchmark could not take its measurement; a missed target is
reported, not an error.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
import traceback
from pathlib import Path

from . import BENCHMARKS
from .common import Check, Result, loadavg, machine_info, render_text, verdict
from .merge import merge
from .report import markdown

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description="HamsterBunker's benchmarks."
    )
    parser.add_argument("--quick", action="store_true", help="few iterations: a smoke run")
    parser.add_argument(
        "--only",
        action="append",
        choices=list(BENCHMARKS),
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help=f"write the report here (default: {DOC.relative_to(REPO)} after a full run "
        "of every benchmark; a quick or partial run writes nothing unless given)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help=f"merge this run's benchmarks into {DOC.relative_to(REPO)} in place of theirs "
        "(the others stay as they are; the machine table says which sections come from "
        "which run)",
    )
    return parser.parse_args(argv)


def _print_result(result: Result) -> None:
    for table in result.tables:
        print()
        print(render_text(table))
    print()
    for check in result.checks:
        print(
            f"  [{verdict(check.ok):>4}] {check.figure}: {check.measured} (target {check.target})"
        )
    for note in result.notes:
        print(textwrap.fill(note, width=100, initial_indent="  · ", subsequent_indent="    "))
    print(f"  ({result.seconds:.0f} s; load average {result.load_before} → {result.load_after})")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    names = args.only or list(BENCHMARKS)
    mode = "quick" if args.quick else "full"
    machine = machine_info(REPO)
    print(f"HamsterBunker benchmarks ({mode}): {', '.join(names)}")
    for key, value in machine:
        print(f"  {key}: {value}")
    results: list[Result] = []
    failed = False
    started = time.monotonic()
    for name in names:
        module = BENCHMARKS[name]
        print(f"\n=== {module.TITLE} [{name}] ===\n")
        print(textwrap.indent(module.METHOD.rstrip(), "  "))
        load_before = loadavg()
        bench_started = time.monotonic()
        try:
            result = module.run(quick=args.quick)
        except Exception as exc:  # report, then go on with the others
            failed = True
            traceback.print_exc()
            result = Result(
                name, module.TITLE, module.METHOD,
                checks=[Check("benchmark completed", f"no: {exc}", "yes", False)],
            )  # fmt: skip
        result.seconds = time.monotonic() - bench_started
        result.load_before, result.load_after = load_before, loadavg()
        _print_result(result)
        results.append(result)
    total = time.monotonic() - started

    print("\n=== Summary ===\n")
    for result in results:
        for check in result.checks:
            print(f"  [{verdict(check.ok):>4}] {result.name}: {check.figure}: {check.measured}"
                  f" (target {check.target})")  # fmt: skip
    print(f"\n  total run time {total:.0f} s ({mode})")

    output = args.output
    if output is None and not args.quick and not args.only:
        output = DOC
    command = "python -m benchmarks" + (" --quick" if args.quick else "")
    command += "".join(f" --only {name}" for name in args.only or [])
    report = markdown(results, machine, quick=args.quick, total_s=total, command=command)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(report)
        print(f"  report written to {output}")
    if args.merge:
        facts = dict(machine)
        note = (f"{', '.join(r.title for r in results)} at {facts.get('date', '?')} on "
                f"{facts.get('revision', '?')}, `{command}`")  # fmt: skip
        titles = [module.TITLE for module in BENCHMARKS.values()]
        DOC.write_text(merge(DOC.read_text(), report, titles, note))
        print(f"  merged into {DOC.relative_to(REPO)}")
    elif not args.merge:
        print(f"  {DOC.relative_to(REPO)} not written (quick or partial run; --output FILE "
              "writes, --merge merges)")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
