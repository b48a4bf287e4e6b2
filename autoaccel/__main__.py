"""The `autoaccel` command (and `python -m autoaccel`).

A plain `autoaccel lint` call, only paths and on/off flags (what the pre-commit hooks
run), is run without typer: importing it and parsing with it cost ~0.01 CPU-s of a
0.23 s one-file run. Everything else is parsed by the typer app in `autoaccel.cli`."""

import gc
import sys
from collections.abc import Iterator

from autoaccel.config import use_rule_catalog


def rule_codes() -> Iterator[str]:
    """The codes of the rule catalog, imported when a setting names rules."""
    from autoaccel.rules import all_rules

    return (rule.code for rule in all_rules())


def main() -> None:
    use_rule_catalog(rule_codes)  # the settings' rule selectors are checked against it
    if sys.argv[1:2] == ["lint"]:
        # The lint machinery (LibCST's ~300 node classes and the rules) lives until the
        # process exits: imported without collections and then frozen, the cyclic
        # collector never re-scans it, at exit included (~0.03 CPU-s of a one-file run).
        gc.disable()
        from autoaccel.lint.command import run_plain_call

        gc.freeze()
        gc.enable()
        code = run_plain_call(sys.argv[2:])
        if code is not None:
            sys.exit(code)
    from autoaccel.cli import main as parse_with_typer

    parse_with_typer()


if __name__ == "__main__":
    main()
