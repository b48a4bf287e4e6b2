"""Draw the sample of real findings to label: lint checkouts of public repositories and
pick, with a fixed seed, up to N findings of every rule.

    .venv/bin/python benchmarks/precision/sample.py CHECKOUTS_DIR [--per-rule 5] [--seed 14]

CHECKOUTS_DIR holds one git checkout per repository, named `owner+name` (as
`git clone` of the mirror gives them). The result is written to `labels.json` next to
this script (or `--labels FILE`): the file references of the sampled findings
(repository, commit, path, line, column, rule) and every rule's finding count. Labels
already in the file are kept for the findings that are drawn again; new ones get
`"label": null`, to be filled in by reading the code (`true`: the finding is right;
`false`: a false alarm), with a one-line reason. Nothing of the repositories' code is
stored.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

LABELS = Path(__file__).resolve().parent / "labels.json"


def lint(checkouts: Path) -> list[dict]:
    """`autoaccel lint --format json` over all checkouts, default settings."""
    run = subprocess.run(
        [sys.executable, "-m", "autoaccel", "lint", "--format", "json", "--exit-zero", "-q", "."],
        cwd=checkouts,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(run.stdout)


def findings(checkouts: Path, linted: list[dict]) -> list[dict]:
    """The findings of `linted` (paths `./owner+name/...`) as file references."""
    commits = {}
    found = []
    for finding in linted:
        checkout, path = finding["filename"].removeprefix("./").split("/", 1)
        if checkout not in commits:
            commits[checkout] = subprocess.run(
                ["git", "rev-parse", "HEAD"],
                cwd=checkouts / checkout,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        found.append(
            {
                "repo": checkout.replace("+", "/", 1),
                "commit": commits[checkout],
                "path": path,
                "line": finding["location"]["row"],
                "column": finding["location"]["column"],
                "code": finding["code"],
            }
        )
    return found


def key(finding: dict) -> tuple:
    return (finding["repo"], finding["path"], finding["line"], finding["column"], finding["code"])


def draw(found: list[dict], per_rule: int, seed: int) -> list[dict]:
    """Up to `per_rule` findings of each rule, chosen by a shuffle seeded per rule (so a
    change in one rule's findings does not redraw the others)."""
    by_rule: dict[str, list[dict]] = defaultdict(list)
    for finding in sorted(found, key=key):
        by_rule[finding["code"]].append(finding)
    sample = []
    for code, pool in sorted(by_rule.items()):
        rng = random.Random(f"{seed}-{code}")
        sample.extend(rng.sample(pool, min(per_rule, len(pool))))
    return sorted(sample, key=key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", type=Path)
    parser.add_argument("--per-rule", type=int, default=5)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--labels", type=Path, default=LABELS, help="the file to write")
    parser.add_argument(
        "--findings",
        type=Path,
        help="the JSON that `autoaccel lint --format json .` printed "
        "in CHECKOUTS_DIR (saves linting again)",
    )
    args = parser.parse_args(argv)

    previous = json.loads(args.labels.read_text()) if args.labels.exists() else {"sample": []}
    known = {key(f): f for f in previous["sample"] if f.get("label") is not None}
    linted = json.loads(args.findings.read_text()) if args.findings else lint(args.checkouts)
    found = findings(args.checkouts, linted)
    counts: dict[str, int] = defaultdict(int)
    for finding in found:
        counts[finding["code"]] += 1
    sample = [
        {
            **finding,
            "label": None,
            "reason": "",
            **{
                field: known[key(finding)][field]
                for field in ("label", "reason")
                if key(finding) in known
            },
        }
        for finding in draw(found, args.per_rule, args.seed)
    ]
    args.labels.write_text(
        json.dumps(
            {
                "seed": args.seed,
                "per_rule": args.per_rule,
                "findings_per_rule": dict(sorted(counts.items())),
                "sample": sample,
            },
            indent=1,
        )
        + "\n"
    )
    unlabelled = sum(f["label"] is None for f in sample)
    print(f"{len(found)} findings, {len(sample)} drawn, {unlabelled} to label -> {args.labels}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
