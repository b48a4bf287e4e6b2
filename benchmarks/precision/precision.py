"""Print the precision of every rule from the labelled sample in `labels.json`.

    python benchmarks/precision/precision.py [labels.json]

Per rule: the share of its sampled findings labelled true. Overall: the share of the
whole sample, and the estimate for all findings (each rule's precision weighted by
how many findings it has, since the sample draws the same number from every rule),
both over the rules a default `autoaccel lint` runs (opt-in rules are listed apart).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from autoaccel.rules import all_rules

LABELS = Path(__file__).resolve().parent / "labels.json"


def main(argv: list[str]) -> int:
    data = json.loads(Path(argv[0] if argv else LABELS).read_text())
    labelled = [f for f in data["sample"] if f["label"] is not None]
    if not labelled:
        print("no labelled findings")
        return 1
    true, total = Counter(), Counter()
    for finding in labelled:
        total[finding["code"]] += 1
        true[finding["code"]] += finding["label"]
    counts = data["findings_per_rule"]
    opt_in = {rule.code for rule in all_rules() if not rule.default}
    print(f"{'rule':<8} {'findings':>8} {'labelled':>8} {'true':>5} {'precision':>9}")
    for code in sorted(total):
        print(
            f"{code:<8} {counts.get(code, 0):>8} {total[code]:>8} {true[code]:>5}"
            f" {true[code] / total[code]:>9.0%}"
            + ("  (opt-in: not in the overall)" if code in opt_in else "")
        )
    for code in opt_in:
        del true[code], total[code]  # (a Counter forgives missing keys)
    sample_precision = sum(true.values()) / sum(total.values())
    population = sum(counts.get(code, 0) for code in total)
    weighted = sum(counts.get(code, 0) * true[code] / total[code] for code in total) / population
    print(
        f"overall: {sum(true.values())}/{sum(total.values())} = {sample_precision:.0%} of the sample;"
        f" {weighted:.0%} of all {population} findings (weighted by rule)"
    )
    unlabelled = len(data["sample"]) - len(labelled)
    if unlabelled:
        print(f"({unlabelled} drawn findings are not labelled yet)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
