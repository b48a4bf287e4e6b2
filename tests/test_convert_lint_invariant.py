"""What `convert` fixes, `lint` no longer finds: linting a converted fixture reports none
of the rule codes the conversion applied (a rule and its fix that disagree would show
here, e.g. a fix made in one function while the rule looks at another)."""

from __future__ import annotations

import pytest

from autoaccel.config import LintSettings
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.lint.runner import Mode, lint_text
from running import FIXTURES_DIR, fixture_names

pytestmark = pytest.mark.runs  # converts every fixture: seconds, not milliseconds


@pytest.mark.parametrize("name", fixture_names())
def test_lint_of_the_conversion_finds_nothing_it_fixed(name):
    """`--to ddp`: every single-process fix, and the ddp steps that carry a rule code."""
    source = (FIXTURES_DIR / name).read_text(encoding="utf-8")
    conversion = convert_source(source, ConvertOptions(target="ddp"))
    fixed = {change.code for change in conversion.log.changes if change.code.startswith("ACC")}
    assert fixed, "the fixtures are slow on purpose: the conversion fixes something"
    found = lint_text(conversion.converted, name, LintSettings(), Mode.CHECK)
    assert found.error is None
    again = sorted({d.code for d in found.diagnostics} & fixed)
    assert not again, f"fixed by convert, still reported by lint: {again}"
