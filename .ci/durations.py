"""The suite's time, for CONTRIBUTING's table: each test file's total and the slowest tests, from the
output of ``pytest --durations=0`` (run on a quiet machine, after ``make demo`` in a fresh clone).

    .venv/bin/python -m pytest --durations=0 -q | tee out/durations.log
    python .ci/durations.py out/durations.log          # prints the two Markdown tables

A session-scoped fixture (a multi-process launch, the grader's whole runs, the trained model) is
counted in the setup of the first test that asks for it, so its file carries it. Files with no
measured time are listed with 0 s: every test file appears (tests/test_layout.py checks the table
against the files that exist, not against the times).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)")


def read(log: str) -> tuple[Counter, Counter]:
    per_file: Counter = Counter()
    per_test: Counter = Counter()
    for line in log.splitlines():
        m = LINE.match(line.strip())
        if m:
            seconds, _, nodeid = float(m.group(1)), m.group(2), m.group(3)
            per_file[nodeid.split("::")[0]] += seconds
            per_test[nodeid] += seconds
    return per_file, per_test


def tables(log: str, top: int = 20) -> str:
    per_file, per_test = read(log)
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))
    total = sum(per_file.values())
    lines = ["| test file | seconds | share |", "| --- | ---: | ---: |"]
    for name in sorted(files, key=lambda f: -per_file.get(f, 0.0)):
        s = per_file.get(name, 0.0)
        lines.append(f"| `{name}` | {s:.0f} | {100 * s / total:.0f}% |")
    lines.append(f"| all | {total:.0f} | 100% |")
    lines += ["", f"| the {top} slowest tests (setup included) | seconds |", "| --- | ---: |"]
    for nodeid, s in per_test.most_common(top):
        lines.append(f"| `{nodeid}` | {s:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(tables(Path(sys.argv[1]).read_text(encoding="utf-8")), end="")
