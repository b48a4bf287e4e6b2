"""Run mypy and fail if it finds more than the committed baseline: a baseline that may only shrink.

The baseline (.ci/mypy-baseline.json) counts errors by file and error code, so that editing a
file with old errors passes while a new error, or an error of a new kind, fails. When counts
shrink the gate passes and asks for `--update`, which rewrites the baseline from this run.

    python .ci/mypy_gate.py [--update]

Stdlib only; mypy's own configuration is [tool.mypy] in pyproject.toml.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / ".ci" / "mypy-baseline.json"
# `path:line[:column]: error: message  [code]`; notes and the summary line are not errors.
_ERROR = re.compile(r"^(?P<path>[^:\n]+):\d+(?::\d+)?: error: .*?(?:\s+\[(?P<code>[\w-]+)\])?$")

Key = tuple[str, str]  # (file, error code)


def parse(output: str) -> tuple[Counter[Key], dict[Key, list[str]]]:
    """Error counts by (file, code) in mypy's output, and the lines of each."""
    counts: Counter[Key] = Counter()
    lines: dict[Key, list[str]] = {}
    for line in output.splitlines():
        if match := _ERROR.match(line):
            key = (Path(match["path"]).as_posix(), match["code"] or "unknown")
            counts[key] += 1
            lines.setdefault(key, []).append(line)
    return counts, lines


def load(path: Path) -> Counter[Key]:
    """The baseline: `{file: {code: count}}`."""
    data = json.loads(path.read_text()) if path.exists() else {}
    return Counter({(file, code): n for file, codes in data.items() for code, n in codes.items()})


def dump(counts: Counter[Key], path: Path) -> None:
    data: dict[str, dict[str, int]] = {}
    for (file, code), n in sorted(counts.items()):
        data.setdefault(file, {})[code] = n
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def check(output: str, baseline: Path, update: bool = False) -> int:
    """Compare mypy's `output` with `baseline` and report: 0 within it, 1 above it."""
    counts, lines = parse(output)
    allowed = load(baseline)
    total, limit = sum(counts.values()), sum(allowed.values())
    if update:
        dump(counts, baseline)
        print(f"mypy gate: baseline rewritten, {total} errors (was {limit})")
        return 0
    grown = sorted(key for key in counts if counts[key] > allowed[key])
    if grown:
        for key in grown:
            file, code = key
            print(f"{file} [{code}]: {counts[key]}, baseline {allowed[key]}")
            print("\n".join(f"    {line}" for line in lines[key]))
        print(f"mypy gate: FAILED, new errors in {len(grown)} (file, code) pairs (see above)")
        return 1
    if any(counts[key] < n for key, n in allowed.items()):
        print(
            f"mypy gate: {total} errors, fewer than the baseline's {limit}: run "
            f"`python .ci/mypy_gate.py --update` and commit {baseline.relative_to(ROOT)}"
        )
    else:
        print(f"mypy gate: {total} errors, as in the baseline")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite the baseline from this run")
    args = parser.parse_args(argv)
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--no-pretty", "--no-color-output"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if run.returncode not in (0, 1):  # 2: mypy itself failed (configuration, crash)
        print(run.stdout + run.stderr, file=sys.stderr)
        print(f"mypy gate: mypy exited with {run.returncode}", file=sys.stderr)
        return 2
    return check(run.stdout, BASELINE, args.update)


if __name__ == "__main__":
    sys.exit(main())
