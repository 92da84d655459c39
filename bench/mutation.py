"""The kill rate of the last `mutmut run` per module and overall, read from
`mutmut results --all true` (one ``    <module>.<function>__mutmut_<n>: <status>`` line a mutant).

    .venv/bin/python -m bench.mutation      (the last step of ``make mutate``)

A mutant counts as killed when a test failed (``killed``) or ran past its CPU limit
(``timeout``: the tests noticed the change, they did not pass). ``survived`` and ``no tests``
(no selected test runs its function) are the ones to read with ``mutmut show <name>``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from rich.table import Table

from harness.markdown import table_markdown

KILLED = ("killed", "timeout")
COLUMNS = ("killed", "timeout", "survived", "no tests")
MUTMUT = Path(sys.executable).parent / "mutmut"


def module_of(name: str) -> str:
    """``edge.audit`` of ``edge.audit.xǁAuditǁsample__mutmut_3``: the parts before the mangled
    function's (``x_`` for a function, ``xǁ`` for a method)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.startswith(("x_", "xǁ")):
            return ".".join(parts[:i])
    raise ValueError(f"not a mutmut mutant name: {name!r}")


def tally(lines: Iterable[str]) -> dict[str, Counter[str]]:
    """Statuses counted per module, from the lines of `mutmut results --all true`."""
    counts: dict[str, Counter[str]] = {}
    for line in lines:
        name, sep, status = line.strip().rpartition(": ")
        if not sep or "__mutmut_" not in name:
            continue
        counts.setdefault(module_of(name), Counter())[status] += 1
    return counts


def killed(counts: Counter[str]) -> int:
    return sum(counts[s] for s in KILLED)


def rate(counts: Counter[str]) -> float:
    """Killed share of the mutants that were run (those ``not checked`` yet are left out)."""
    run = counts.total() - counts["not checked"]
    return killed(counts) / run if run else 0.0


def table(counts: dict[str, Counter[str]]) -> Table:
    overall = sum(counts.values(), Counter())
    out = Table("module", "mutants run", *COLUMNS, "kill rate")
    for module, c in [*sorted(counts.items()), ("all", overall)]:
        run = c.total() - c["not checked"]
        out.add_row(module, str(run), *(str(c[s]) for s in COLUMNS),
                    f"{rate(c):.1%}" if run else "not run")
    other = overall.total() - sum(overall[s] for s in (*COLUMNS, "not checked"))
    notes = [f"{overall['not checked']} not run yet (an interrupted run)"] * bool(
        overall["not checked"]) + [f"{other} suspicious, segfault or skipped"] * bool(other)
    out.caption = "; ".join(notes) or None
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--results", type=Path,
                        help="a saved `mutmut results --all true` (default: run it here)")
    args = parser.parse_args(argv)
    if args.results:
        text = args.results.read_text()
    else:
        text = subprocess.run([str(MUTMUT), "results", "--all", "true"], capture_output=True,
                              text=True, check=True).stdout
    counts = tally(text.splitlines())
    if not counts:
        sys.exit("no mutmut results: run `make mutate` (mutmut run) first")
    print(table_markdown(table(counts)))


if __name__ == "__main__":
    main()
