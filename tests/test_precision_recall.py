"""benchmarks/precision/recall.py matches findings to the expected ones and counts right, on a
tiny checkout made here (no network); recall.json holds only well-formed file references."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from autoaccel.rules import all_rules

ROOT = Path(__file__).resolve().parent.parent
PRECISION = ROOT / "benchmarks" / "precision"
_spec = importlib.util.spec_from_file_location("recall", PRECISION / "recall.py")
recall = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recall)

REPO, PATH = "me/demo", "train.py"
COMMIT = "0" * 40
SCRIPT = """\
import torch
from torch.utils.data import DataLoader

model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(dataset, batch_size=8, num_workers=2)
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def entry(line: int, rule: str, path: str = PATH) -> dict:
    return {
        "repo": REPO,
        "commit": COMMIT,
        "path": path,
        "line": line,
        "rule": rule,
        "reason": "synthetic",
    }


def finding(line: int, rule: str, path: str = PATH) -> dict:
    return {"repo": REPO, "path": path, "line": line, "rule": rule}


def lint_json(*findings: tuple[int, str]) -> list[dict]:
    return [
        {
            "filename": f"./me+demo/{PATH}",
            "location": {"row": line, "column": 1},
            "code": code,
            "message": "",
        }
        for line, code in findings
    ]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "me+demo").mkdir()
    (tmp_path / "me+demo" / PATH).write_text(SCRIPT)
    return tmp_path


def write_recall(folder: Path, expected: list[dict]) -> Path:
    path = folder / "recall.json"
    path.write_text(
        json.dumps(
            {
                "files": [{"repo": REPO, "commit": COMMIT, "path": PATH, "new": True}],
                "expected": expected,
            }
        )
    )
    return path


def test_a_finding_one_line_away_finds_the_entry_two_lines_away_does_not():
    hit, right = recall.match(
        [entry(10, "ACC204"), entry(20, "ACC204")], [finding(11, "ACC204"), finding(22, "ACC204")]
    )
    assert hit == [True, False]
    assert right == [True, False]


def test_rule_and_file_must_be_the_same():
    hit, right = recall.match(
        [entry(10, "ACC204")], [finding(10, "ACC103"), finding(10, "ACC204", path="other.py")]
    )
    assert hit == [False] and right == [False, False]


def test_one_finding_does_not_find_two_neighbouring_entries():
    """`x.to(d)` on line 10 and `y.to(d)` on line 11, only the first reported."""
    hit, right = recall.match([entry(11, "ACC103"), entry(10, "ACC103")], [finding(10, "ACC103")])
    assert hit == [False, True]  # the exact line takes it, not the neighbour
    assert right == [True]


def test_two_findings_on_one_line_are_both_right():
    hit, right = recall.match([entry(10, "ACC103")], [finding(10, "ACC103"), finding(10, "ACC103")])
    assert hit == [True] and right == [True, True]


def test_script_level_rules_match_anywhere_in_the_file():
    hit, right = recall.match(
        [entry(1, "ACC301"), entry(1, "ACC201")],
        [finding(40, "ACC301"), finding(40, "ACC201", path="other.py")],
    )
    assert hit == [True, False] and right == [True, False]


def test_table_counts_per_rule():
    expected = [entry(6, "ACC102"), entry(8, "ACC204"), entry(9, "ACC204")]
    found = [
        finding(6, "ACC102"),
        finding(8, "ACC204"),
        finding(30, "ACC204"),
        finding(1, "ACC505"),
    ]
    rows = recall.table(expected, found, *recall.match(expected, found))
    assert rows["ACC102"] == {"expected": 1, "found": 1, "findings": 1, "true": 1}
    assert rows["ACC204"] == {"expected": 2, "found": 1, "findings": 2, "true": 1}
    # the opt-in rule is counted in its row, left out of the overall
    assert recall.overall(rows, "all") == "all: recall 2/3 = 67%; strict precision 2/3 = 67%"


def test_main_prints_recall_precision_and_misses(checkout: Path, capsys):
    recall_json = write_recall(
        checkout,
        [
            entry(7, "ACC102"),  # reported at 6: one line away
            entry(2, "ACC301"),  # script-level: reported at 8
            entry(11, "ACC205"),  # never reported: a miss
        ],
    )
    findings = checkout / "lint.json"
    findings.write_text(json.dumps(lint_json((6, "ACC102"), (8, "ACC301"), (8, "ACC103"))))
    assert (
        recall.main([str(checkout), "--recall", str(recall_json), "--findings", str(findings)]) == 0
    )
    out = capsys.readouterr().out
    assert "overall: recall 2/3 = 67%; strict precision 2/3 = 67%" in out
    assert "new repositories: recall 2/3 = 67%" in out
    assert re.search(r"ACC205 +1 +0 +0% +0 +0 +-", out)
    assert "misses (1):\n  ACC205 me/demo train.py:11" in out
    assert "findings not expected (1):\n  ACC103 me/demo train.py:8" in out


def test_main_lints_only_the_listed_files(checkout: Path, capsys):
    (checkout / "me+demo" / "unlisted.py").write_text(SCRIPT)
    recall_json = write_recall(checkout, [entry(6, "ACC102")])
    assert recall.main([str(checkout), "--recall", str(recall_json)]) == 0
    out = capsys.readouterr().out
    assert "ACC102          1      1   100%" in out
    assert "unlisted.py" not in out


def test_main_stops_when_a_listed_file_is_missing(tmp_path: Path, capsys):
    recall_json = write_recall(tmp_path, [entry(6, "ACC102")])
    assert recall.main([str(tmp_path), "--recall", str(recall_json)]) == 2
    assert "missing: me+demo/train.py" in capsys.readouterr().err


def test_recall_json_is_well_formed():
    data = json.loads((PRECISION / "recall.json").read_text())
    codes = {rule.code for rule in all_rules()}
    files = {(f["repo"], f["path"]): f for f in data["files"]}
    assert len(files) == len(data["files"]) >= 20
    for entry in data["files"]:
        assert set(entry) == {"repo", "commit", "path", "new"}
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"])
    keys = set()
    for item in data["expected"]:
        assert set(item) == {"repo", "commit", "path", "line", "rule", "reason"}, item
        assert item["rule"] in codes, item
        assert isinstance(item["line"], int) and item["line"] > 0, item
        assert item["reason"].strip() and "\n" not in item["reason"], item
        assert (item["repo"], item["path"]) in files, item
        assert item["commit"] == files[item["repo"], item["path"]]["commit"], item
        key = (item["repo"], item["path"], item["line"], item["rule"])
        assert key not in keys, f"duplicate {key}"
        keys.add(key)
    for item in data.get("unexpected", []):
        assert set(item) == {"repo", "commit", "path", "line", "rule", "label", "reason"}, item
        assert item["rule"] in codes and isinstance(item["label"], bool), item
        assert (item["repo"], item["path"]) in files and item["reason"].strip(), item


def test_half_the_recall_files_come_from_repositories_not_labelled_before():
    data = json.loads((PRECISION / "recall.json").read_text())
    seen = {
        f["repo"]
        for name in ("labels.json", "holdout.json")
        for f in json.loads((PRECISION / name).read_text())["sample"]
    }
    new = [f for f in data["files"] if f["new"]]
    assert 2 * len(new) >= len(data["files"])
    assert not {f["repo"] for f in new} & seen
