"""Is `autoaccel lint` slower than it was at an earlier commit? Lints the same files
(the earlier commit's fixtures and style samples, three times over) in process with
this checkout and with that commit, alternating runs so that a busy machine slows both
alike, and prints the best CPU time of each and their ratio.

    .venv/bin/python benchmarks/lint_compare.py 8df83cd [--rounds 5]

CPU time (`time.process_time()`), not wall time: it stays honest on a shared machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run in a child process with the checkout to time first on sys.path.
TIME_ONE_ROUND = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from autoaccel.lint.runner import Mode, Overrides, lint_file
files = [Path(p) for p in sys.argv[2:]]
lint_file(files[0], Overrides(), Mode.CHECK)  # imports and caches warm
start = time.process_time()
findings = sum(len(lint_file(path, Overrides(), Mode.CHECK).diagnostics) for path in files)
print(time.process_time() - start, findings)
"""


def export(revision: str, into: Path) -> Path:
    """The tree of `revision` (the package, fixtures and style samples), unpacked."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", revision, "autoaccel", "fixtures", "tests/styles"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def one_round(checkout: Path, files: list[Path]) -> tuple[float, int]:
    output = subprocess.run(
        [sys.executable, "-c", TIME_ONE_ROUND, str(checkout), *map(str, files)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return float(output[0]), int(output[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revision", help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lint-compare-") as scratch:
        earlier = export(args.revision, Path(scratch))
        files = sorted((earlier / "fixtures").glob("*.py")) + sorted(
            (earlier / "tests" / "styles").glob("*.py")
        )
        files *= 3
        best = {ROOT: float("inf"), earlier: float("inf")}
        findings = {}
        for _ in range(args.rounds):
            for checkout in best:
                seconds, findings[checkout] = one_round(checkout, files)
                best[checkout] = min(best[checkout], seconds)
    now, then = best[ROOT], best[earlier]
    print(f"{len(files)} files, best of {args.rounds} rounds, CPU-s")
    print(f"{args.revision:>12}: {then:.3f} ({findings[earlier]} findings)")
    print(f"{'this tree':>12}: {now:.3f} ({findings[ROOT]} findings)")
    print(f"{'ratio':>12}: {now / then:.2f}x")


if __name__ == "__main__":
    main()
