"""Print the recall of every rule on a hand-labelled set of training scripts (`recall.json`),
and the precision of the findings on the same files.

    .venv/bin/python benchmarks/precision/recall.py CHECKOUTS_DIR [--recall recall.json ...]

CHECKOUTS_DIR holds one git checkout per repository, named `owner+name` (as for
`sample.py`). `recall.json` lists the files of the set and, for each, every place where
a rule's pattern is present on a GPU training path ("expected findings"), found by
reading the code; only file references and a one-line reason are stored.

Only the listed files are linted, with the default rules plus the opt-in ACC505
(`autoaccel lint --format json --extend-select ACC505`): the default set is what users
get, and ACC505 is reported apart, out of the overall figures, as `precision.py` does.

Matching: a finding *finds* an expected entry when it has the same rule, the same file
and a line at most one away; for the script-level rules (ACC201, ACC301: reported once
per script, at a place the rule picks) any finding of that rule in the file does.
Recall = expected entries found / expected entries. Strict precision = findings that
find an expected entry / findings: since every file was read in full, a finding that
matches nothing is a false alarm by that reading (each is listed, to check by hand;
those labelled in `recall.json`'s "unexpected" list are printed with their reason).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

RECALL = Path(__file__).resolve().parent / "recall.json"
TOLERANCE = 1  # lines between an expected entry and a finding that finds it
SCRIPT_LEVEL = frozenset({"ACC201", "ACC301"})  # once per script, at a place the rule picks
OPT_IN = ("ACC505",)


def checkout_name(repo: str) -> str:
    return repo.replace("/", "+", 1)


def lint(checkouts: Path, paths: list[str]) -> list[dict]:
    """`autoaccel lint --format json` over `paths` (relative to `checkouts`)."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoaccel",
            "lint",
            "--format",
            "json",
            "--exit-zero",
            "-q",
            "--extend-select",
            ",".join(OPT_IN),
            *paths,
        ],
        cwd=checkouts,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(run.stdout)


def findings(linted: list[dict]) -> list[dict]:
    """The lint output as (repo, path, line, rule) references."""
    found = []
    for finding in linted:
        checkout, path = finding["filename"].removeprefix("./").split("/", 1)
        found.append(
            {
                "repo": checkout.replace("+", "/", 1),
                "path": path,
                "line": finding["location"]["row"],
                "rule": finding["code"],
            }
        )
    return found


def finds(finding: dict, expected: dict) -> bool:
    """Whether `finding` finds `expected` (the matching rule of the module docstring)."""
    if (finding["repo"], finding["path"], finding["rule"]) != (
        expected["repo"],
        expected["path"],
        expected["rule"],
    ):
        return False
    return expected["rule"] in SCRIPT_LEVEL or abs(finding["line"] - expected["line"]) <= TOLERANCE


def match(expected: list[dict], found: list[dict]) -> tuple[list[bool], list[bool]]:
    """For every expected entry, whether a finding finds it; for every finding, whether it
    finds an expected entry.

    A line-level finding is used up by the entry it finds, exact lines first, so that one
    finding does not count for two entries on neighbouring lines (`x.to(d)` on one line,
    `y.to(d)` on the next); a script-level finding finds every entry of its rule in its file.
    """
    hit = [False] * len(expected)
    used = [False] * len(found)
    for distance in range(TOLERANCE + 1):
        for i, entry in enumerate(expected):
            if hit[i]:
                continue
            for j, finding in enumerate(found):
                if not finds(finding, entry):
                    continue
                script_level = entry["rule"] in SCRIPT_LEVEL
                if script_level or (
                    not used[j] and abs(finding["line"] - entry["line"]) == distance
                ):
                    hit[i] = True
                    used[j] = used[j] or not script_level
                    break
    right = [any(finds(f, e) for e in expected) for f in found]
    return hit, right


def table(expected: list[dict], found: list[dict], hit: list[bool], right: list[bool]) -> dict:
    """Per rule: expected, found, findings, true findings."""
    rows: dict[str, Counter] = {}
    for entry, ok in zip(expected, hit):
        row = rows.setdefault(entry["rule"], Counter())
        row["expected"] += 1
        row["found"] += ok
    for finding, ok in zip(found, right):
        row = rows.setdefault(finding["rule"], Counter())
        row["findings"] += 1
        row["true"] += ok
    return dict(sorted(rows.items()))


def share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def overall(rows: dict, label: str) -> str:
    counted = {code: row for code, row in rows.items() if code not in OPT_IN}
    exp = sum(r["expected"] for r in counted.values())
    got = sum(r["found"] for r in counted.values())
    n = sum(r["findings"] for r in counted.values())
    true = sum(r["true"] for r in counted.values())
    return (
        f"{label}: recall {got}/{exp} = {share(got, exp)};"
        f" strict precision {true}/{n} = {share(true, n)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", type=Path)
    parser.add_argument(
        "--recall",
        type=Path,
        nargs="+",
        default=[RECALL],
        help="the labelled set(s), measured together",
    )
    parser.add_argument(
        "--findings",
        type=Path,
        help="JSON that the lint of the listed files printed (saves linting)",
    )
    args = parser.parse_args(argv)

    sets = [json.loads(path.read_text()) for path in args.recall]
    data = {key: [item for labelled in sets for item in labelled.get(key, [])]
            for key in ("files", "expected", "unexpected")}  # fmt: skip
    files = data["files"]
    for entry in files:
        checkout = args.checkouts / checkout_name(entry["repo"])
        if not (checkout / entry["path"]).is_file():
            print(f"missing: {checkout_name(entry['repo'])}/{entry['path']}", file=sys.stderr)
            return 2
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=checkout,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if head and head != entry["commit"]:
            print(
                f"warning: {checkout.name} is at {head[:12]}, labelled at {entry['commit'][:12]}",
                file=sys.stderr,
            )
    paths = [f"{checkout_name(f['repo'])}/{f['path']}" for f in files]
    linted = json.loads(args.findings.read_text()) if args.findings else lint(args.checkouts, paths)
    found = findings(linted)
    expected = data["expected"]
    hit, right = match(expected, found)
    rows = table(expected, found, hit, right)

    new_repos = {f["repo"] for f in files if f.get("new")}
    print(
        f"{len(files)} files ({sum(f.get('new', False) for f in files)} from"
        f" {len(new_repos)} repositories not used before), {len(expected)} expected,"
        f" {len(found)} findings"
    )
    print(
        f"{'rule':<8} {'expected':>8} {'found':>6} {'recall':>6} {'findings':>8} {'true':>5}"
        f" {'precision':>9}"
    )
    for code, row in rows.items():
        print(
            f"{code:<8} {row['expected']:>8} {row['found']:>6}"
            f" {share(row['found'], row['expected']):>6} {row['findings']:>8} {row['true']:>5}"
            f" {share(row['true'], row['findings']):>9}"
            + ("  (opt-in: not in the overall)" if code in OPT_IN else "")
        )
    print(overall(rows, "overall"))
    for label, keep in (("new repositories", True), ("repositories used before", False)):
        pick_e = [i for i, e in enumerate(expected) if (e["repo"] in new_repos) == keep]
        pick_f = [i for i, f in enumerate(found) if (f["repo"] in new_repos) == keep]
        sub = table(
            [expected[i] for i in pick_e],
            [found[i] for i in pick_f],
            [hit[i] for i in pick_e],
            [right[i] for i in pick_f],
        )
        print(overall(sub, label))
    misses = [e for e, ok in zip(expected, hit) if not ok]
    print(f"\nmisses ({len(misses)}):")
    for e in misses:
        print(f"  {e['rule']} {e['repo']} {e['path']}:{e['line']}  {e['reason']}")
    extra = [f for f, ok in zip(found, right) if not ok]
    labelled = {(u["repo"], u["path"], u["line"], u["rule"]): u for u in data.get("unexpected", [])}
    print(f"\nfindings not expected ({len(extra)}):")
    for f in extra:
        label = labelled.get((f["repo"], f["path"], f["line"], f["rule"]))
        note = f"  [{'true' if label['label'] else 'false'}] {label['reason']}" if label else ""
        print(f"  {f['rule']} {f['repo']} {f['path']}:{f['line']}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
