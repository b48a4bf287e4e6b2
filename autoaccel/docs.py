"""The rule docs (`rules/ACCnnn-name.md`): found, read and split into sections."""

from __future__ import annotations

import re
from pathlib import Path

_PACKAGED = Path(__file__).parent / "_rule_docs"  # where a wheel puts `rules/`
_SOURCE_TREE = Path(__file__).parent.parent / "rules"  # a checkout / editable install
_FENCE = re.compile(r"^```(?:python|py)?\n(.*?)^```", re.S | re.M)


def docs_folder() -> Path:
    return _PACKAGED if _PACKAGED.is_dir() else _SOURCE_TREE


def doc_path(code: str) -> Path | None:
    matches = sorted(docs_folder().glob(f"{code.upper()}-*.md"))
    return matches[0] if matches else None


def rule_doc(code: str) -> str | None:
    path = doc_path(code)
    return path.read_text(encoding="utf-8") if path else None


def sections(doc: str) -> dict[str, str]:
    """`## Heading` -> body text."""
    parts = re.split(r"^## +(.+)$", doc, flags=re.M)
    return {title.strip(): body.strip() for title, body in zip(parts[1::2], parts[2::2])}


def code_blocks(text: str) -> list[str]:
    return _FENCE.findall(text)


def summary(doc: str) -> str:
    """The first paragraph of "What it does"."""
    return sections(doc).get("What it does", "").split("\n\n")[0].replace("\n", " ")
