"""README.md and docs/*.md stay true: the README's rule table lists every rule, its test
command is the one `.ci/run` runs, the pinned refs exist, the bf16 figures are the tests',
and every relative link leads to a file (and heading) that exists. Regenerate the table with
`.venv/bin/python tests/test_readme.py`. The docs' commands run in tests/test_docs_commands.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
START, END = "<!-- rules-table-start -->", "<!-- rules-table-end -->"
sys.path.insert(0, str(ROOT))

from autoaccel.lint.rule import Applicability  # noqa: E402
from autoaccel.rules import all_rules  # noqa: E402


def rules_table() -> str:
    rows = ["| Code | Name | What it finds | Fix |", "| --- | --- | --- | --- |"]
    for rule in all_rules():
        if rule.fix_title is None:
            fix = "—"
        else:
            fix = "safe" if rule.applicability is Applicability.SAFE else "unsafe"
            if rule.unsafe_for:
                fix += f"; unsafe for {rule.unsafe_for}"
        message = rule.message.replace("|", "\\|") + ("" if rule.default else " (opt-in)")
        rows.append(
            f"| [{rule.code}](rules/{rule.code}-{rule.name}.md) | `{rule.name}` | {message} | {fix} |"
        )
    return "\n".join(rows)


def current_table(text: str) -> str:
    start, end = text.index(START) + len(START), text.index(END)
    return text[start:end].strip()


def test_rule_table_lists_every_rule():
    table = current_table(README.read_text(encoding="utf-8"))
    codes = re.findall(r"^\| \[(ACC\d+)\]", table, flags=re.M)
    assert codes == [
        rule.code for rule in all_rules()
    ], "README's rule table is stale: run `.venv/bin/python tests/test_readme.py`"
    assert table == rules_table(), "run `.venv/bin/python tests/test_readme.py`"


def test_rule_table_links_exist():
    table = current_table(README.read_text(encoding="utf-8"))
    for link in re.findall(r"\]\((rules/[^)]+)\)", table):
        assert (ROOT / link).is_file(), f"README links to missing {link}"


def test_ci_runs_the_readme_test_command():
    text = README.read_text(encoding="utf-8")
    extracted = subprocess.run(
        [
            "awk",
            "/<!-- test-command -->/ { marked = 1; next }"
            " marked && /^```/ { if (inside) exit; inside = 1; next }"
            " marked && inside && NF { print; exit }",
            str(README),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert extracted == ".venv/bin/python -m pytest -q -n 2 --dist loadfile"
    assert extracted in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in ci and "set -euo pipefail" in ci


def test_readme_shows_the_set_up_commands():
    text = README.read_text(encoding="utf-8")
    assert (
        "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && "
        ".venv/bin/autoaccel lint fixtures/" in text
    )


def _git_tags() -> set[str]:
    tags = subprocess.run(["git", "tag"], cwd=ROOT, capture_output=True, text=True).stdout
    return set(tags.split())


def _docs_text() -> str:
    return "\n".join(doc.read_text(encoding="utf-8") for doc in DOCS)


def test_snippets_point_at_refs_that_exist():
    """No `rev: v0.1.0` / `@v0.1.0` for a tag that was never made: a branch, a commit sha
    or an existing tag (the snippets are in docs/workflow.md)."""
    text = _docs_text()
    refs = re.findall(r"^\s*rev: (\S+)", text, flags=re.M)
    refs += re.findall(r"uses: autoaccel/autoaccel@(\S+)", text)
    assert refs
    for ref in refs:
        assert ref == "main" or re.fullmatch(r"[0-9a-f]{40}", ref) or ref in _git_tags(), ref


def test_bf16_claims_are_the_tests_tolerances_and_measurements():
    """The docs (docs/convert.md) state the range of the bf16 tolerances of
    tests/test_convert_runs.py and the largest gap measured there (noted beside each case)."""
    cases = (ROOT / "tests" / "test_convert_runs.py").read_text(encoding="utf-8")
    rows = re.findall(r"Case\(.*, ([\d.]+), ([\d.]+)(?:, \w+=.*)?\),  # .* / ([\d.]+) %", cases)
    tolerances = [float(bf16) for _, bf16, _ in rows]
    gaps = [float(gap) for _, _, gap in rows]
    text = " ".join(_docs_text().split())
    assert len(rows) >= 10
    assert f"the tests allow {min(tolerances):.1%} to {max(tolerances):.0%} per fixture" in text
    assert f"and {max(gaps):.1f}% (mnist_main" in text


def _anchor(heading: str) -> str:
    """GitHub's id for a Markdown heading: lower case, punctuation dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {_anchor(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_doc_links_lead_somewhere():
    """Every relative link of README.md and docs/*.md names a file that exists and, after
    `#`, a heading of it: the reference moved from the README into docs/ in one piece."""
    broken = []
    for doc in DOCS:
        text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            if not linked.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, broken


def test_readme_stays_a_front_door():
    """What a newcomer needs, in under 250 lines; the reference is in docs/."""
    text = README.read_text(encoding="utf-8")
    assert text.count("\n") < 250
    for heading in ("## Set-up", "## Quick start", "## Documentation", "## Rules"):
        assert f"\n{heading}" in text, heading
    for doc in DOCS[1:]:
        assert f"(docs/{doc.name})" in text, f"README does not link docs/{doc.name}"


QUICK_START_OUTPUT = "On `fixtures/cnn_toplevel.py` (copied to `train.py`), it prints:"


def test_quick_start_lint_output_is_what_lint_prints(tmp_path):
    """The quick start's `autoaccel lint train.py` output, as the README shows it."""
    text = README.read_text(encoding="utf-8")
    after = text.split(QUICK_START_OUTPUT, 1)[1]
    shown = after.split("```text\n", 1)[1].split("```", 1)[0]
    (tmp_path / "train.py").write_text((ROOT / "fixtures" / "cnn_toplevel.py").read_text())
    run = subprocess.run(
        [sys.executable, "-m", "autoaccel", "lint", "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert run.stdout + run.stderr == shown


if __name__ == "__main__":
    text = README.read_text(encoding="utf-8")
    start, end = text.index(START) + len(START), text.index(END)
    README.write_text(text[:start] + "\n" + rules_table() + "\n" + text[end:], encoding="utf-8")
    print(f"updated the rule table in {README}")
