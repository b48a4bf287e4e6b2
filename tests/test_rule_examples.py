"""Every rule's examples are tests: the class's VALID/INVALID lists and the
Example / "Use instead" blocks of its doc in rules/."""

from __future__ import annotations

import pytest

from autoaccel.config import LintSettings
from autoaccel.docs import code_blocks, doc_path, sections
from autoaccel.lint.engine import lint_source
from autoaccel.lint.fixer import fix_source
from autoaccel.rules import all_rules

RULES = all_rules()
REQUIRED_SECTIONS = ("What it does", "Why is this slow?", "Example", "Use instead", "Fix safety")


def only(rule) -> LintSettings:
    return LintSettings(select=(rule.code,), unsafe_fixes=True)


def codes(source: str, rule) -> list[str]:
    return [d.code for d in lint_source(source, only(rule))]


def class_examples():
    for rule in RULES:
        for index, source in enumerate(rule.VALID):
            yield pytest.param(rule, source, None, id=f"{rule.code}-valid-{index}")
        for index, invalid in enumerate(rule.INVALID):
            yield pytest.param(rule, None, invalid, id=f"{rule.code}-invalid-{index}")


@pytest.mark.parametrize(("rule", "valid", "invalid"), list(class_examples()))
def test_class_example(rule, valid, invalid):
    if valid is not None:
        assert codes(valid, rule) == []
        return
    source = invalid.source
    assert rule.code in codes(source, rule)
    if invalid.fixed is not None:
        result = fix_source(source, only(rule))
        assert result.source == invalid.fixed
        assert rule.code not in [d.code for d in result.remaining]


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.code)
def test_rule_has_doc_with_ruff_sections(rule):
    path = doc_path(rule.code)
    assert path is not None, f"rules/{rule.code}-{rule.name}.md is missing"
    assert path.name == f"{rule.code}-{rule.name}.md"
    text = path.read_text(encoding="utf-8")
    assert text.startswith(f"# {rule.code} {rule.name}\n")
    found = sections(text)
    for section in REQUIRED_SECTIONS:
        assert found.get(section), f"{path.name}: section '{section}' is missing or empty"


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.code)
def test_doc_examples(rule):
    found = sections(doc_path(rule.code).read_text(encoding="utf-8"))
    (example,) = code_blocks(found["Example"])
    (use_instead,) = code_blocks(found["Use instead"])
    assert rule.code in codes(example, rule), "the Example must be reported"
    assert rule.code not in codes(use_instead, rule), "'Use instead' must be clean"
    if rule.fix_title is not None:
        # For a fixable rule the doc shows exactly what the fix writes.
        assert fix_source(example, only(rule)).source == use_instead
