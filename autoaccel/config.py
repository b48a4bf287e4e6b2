"""Settings from `[tool.autoaccel]` in the nearest pyproject.toml, and the CLI."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, replace
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(Exception):
    """A pyproject.toml that cannot be used; the message names the file."""


@dataclass(frozen=True)
class LintSettings:
    """Which rules run on a file, Ruff-style: codes or prefixes."""

    select: tuple[str, ...] = ("ACC",)
    ignore: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    root: Path | None = None  # folder of the pyproject.toml the settings came from
    unsafe_fixes: bool = False

    def enabled(self, code: str, path: str | None = None) -> bool:
        """Whether `code` is selected, not ignored, and not ignored for `path`."""
        if not _matches(code, self.select) or _matches(code, self.ignore):
            return False
        if path is None or not self.per_file_ignores:
            return True
        relative = _relative(Path(path), self.root)
        return not any(
            _matches(code, codes)
            for pattern, codes in self.per_file_ignores
            if fnmatch(relative, pattern) or fnmatch(Path(relative).name, pattern)
        )


def _matches(code: str, prefixes: tuple[str, ...]) -> bool:
    return any(code.startswith(prefix) for prefix in prefixes)


def _relative(path: Path, root: Path | None) -> str:
    resolved = path.resolve()
    if root is not None and resolved.is_relative_to(root):
        return resolved.relative_to(root).as_posix()
    return path.as_posix()


def _codes(value: Any, key: str, source: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: tool.autoaccel.{key} must be a list of rule codes")
    return tuple(v.upper() for v in value)


def read_tool_table(pyproject: Path) -> dict[str, Any] | None:
    """The `[tool.autoaccel]` table of `pyproject`, or None when it has none."""
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{pyproject}: {error}") from error
    table = data.get("tool", {}).get("autoaccel")
    return table if isinstance(table, dict) else None


@functools.cache
def find_config(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The nearest pyproject.toml at or above `directory` with a [tool.autoaccel] table."""
    for folder in (directory, *directory.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            table = read_tool_table(candidate)
            if table is not None:
                return candidate, table
    return None


def settings_from_table(table: dict[str, Any], source: Path) -> LintSettings:
    settings = LintSettings(root=source.parent.resolve())
    if "select" in table:
        settings = replace(settings, select=_codes(table["select"], "select", source))
    if "extend-select" in table:
        extra = _codes(table["extend-select"], "extend-select", source)
        settings = replace(settings, select=settings.select + extra)
    if "ignore" in table:
        settings = replace(settings, ignore=_codes(table["ignore"], "ignore", source))
    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise ConfigError(f"{source}: tool.autoaccel.per-file-ignores must be a table")
    settings = replace(
        settings,
        per_file_ignores=tuple(
            (pattern, _codes(codes, f"per-file-ignores.{pattern}", source))
            for pattern, codes in per_file.items()
        ),
    )
    return settings


def settings_for(path: Path) -> LintSettings:
    """Settings from the pyproject.toml nearest to `path` (defaults when none)."""
    start = path.resolve()
    found = find_config(start if start.is_dir() else start.parent)
    if found is None:
        return LintSettings()
    return settings_from_table(found[1], found[0])
