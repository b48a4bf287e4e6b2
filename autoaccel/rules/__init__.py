"""The rule catalog: every `accNNN_*.py` module here defines one `LintRule`."""

from __future__ import annotations

import functools
import importlib
import pkgutil

from autoaccel.lint.rule import LintRule


@functools.cache
def all_rules() -> tuple[type[LintRule], ...]:
    """Every rule class, sorted by code."""
    found: list[type[LintRule]] = []
    for module_info in pkgutil.iter_modules(__path__):
        if not module_info.name.startswith("acc"):
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        found.extend(
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, LintRule)
            and value.__module__ == module.__name__
        )
    return tuple(sorted(found, key=lambda rule: rule.code))


def rule_by_code(code: str) -> type[LintRule] | None:
    return next((rule for rule in all_rules() if rule.code == code.upper()), None)
