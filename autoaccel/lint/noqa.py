"""`# noqa` and `# noqa: ACC101, ACC102` suppression comments."""

from __future__ import annotations

import io
import re
import tokenize

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.I)
ALL = frozenset({"*"})


def suppressions(source: str) -> dict[int, frozenset[str]]:
    """Line number -> suppressed codes (`ALL` for a bare `# noqa`). Comments only."""
    found: dict[int, frozenset[str]] = {}
    if "noqa" not in source.lower():
        return found
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type != tokenize.COMMENT:
                continue
            match = _NOQA.search(token.string)
            if match is None:
                continue
            codes = match.group("codes")
            found[token.start[0]] = frozenset(re.split(r"[\s,]+", codes.upper())) if codes else ALL
    except (tokenize.TokenError, SyntaxError):
        pass
    return found


def is_suppressed(code: str, line: int, table: dict[int, frozenset[str]]) -> bool:
    codes = table.get(line)
    return codes is not None and (codes is ALL or code in codes)
