"""Settings from `[tool.autoaccel]` in the nearest pyproject.toml, and the CLI.

Lint settings sit in the table itself (Ruff's keys); `[tool.autoaccel.convert]` holds
defaults for `autoaccel convert`, read by `autoaccel.convert.settings`.
"""

from __future__ import annotations

import functools
import os
import stat
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from autoaccel.fileio import file_kind, os_error_message, read_bytes, real_path


class ConfigError(Exception):
    """A pyproject.toml that cannot be used; the message names the file."""


# Test code is not training code: its loaders, loops and models exercise the code
# under test (`DataLoader(Mock())`). Ruff's pattern kinds: a name, or a path with `/`.
DEFAULT_EXCLUDE = ("tests", "test_*.py", "*_test.py", "conftest.py")
DEFAULT_SELECT = ("ACC",)
# What a commit hook enforces when pyproject.toml does not choose the rules (Ruff's small
# default set): findings that are certain and cheap to act on. Rules with only safe fixes
# (`autoaccel-fix` fixes them), and definite bugs: a crash (ACC104, ACC503), the same
# order every epoch (ACC105), lost determinism (ACC202), a growing graph (ACC203),
# ranks writing one file (ACC403). Advice that changes numerics or needs a decision
# (workers, AMP, non_blocking, DataParallel) is left to `autoaccel lint` and `convert`.
PRECISE_SELECT = (
    "ACC102",
    "ACC104",
    "ACC105",
    "ACC202",
    "ACC203",
    "ACC205",
    "ACC302",
    "ACC403",
    "ACC501",
    "ACC502",
    "ACC503",
    "ACC504",
)


@dataclass(frozen=True)
class LintSettings:
    """Which rules run on a file, Ruff-style: codes or prefixes."""

    select: tuple[str, ...] = DEFAULT_SELECT  # with `extend-select` appended
    select_configured: bool = False  # whether pyproject.toml sets `select`
    ignore: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Files and folders that directory walks skip (Ruff's `exclude`, `extend-exclude`);
    # with `force_exclude` also paths named on the command line.
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    extend_exclude: tuple[str, ...] = ()
    force_exclude: bool = False
    root: Path | None = None  # folder of the pyproject.toml the settings came from
    unsafe_fixes: bool = False
    # Ruff's `extend-safe-fixes`: codes or prefixes whose unsafe fixes count as safe.
    extend_safe_fixes: tuple[str, ...] = ()

    def names(self, code: str) -> bool:
        """Whether `select` (with `extend-select`) names `code` in full."""
        return code in self.select

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

    def precise(self) -> LintSettings:
        """These settings with `PRECISE_SELECT` as the default selection: unless
        pyproject.toml sets `select`, the precise rules and its `extend-select`."""
        if self.select_configured:
            return self
        return replace(self, select=PRECISE_SELECT + self.select[len(DEFAULT_SELECT) :])

    def excludes(self, path: Path, ancestors: bool = False) -> bool:
        """Whether `path` (a file or a folder) is excluded: a pattern without `/` matches
        its name, one with `/` its path from the settings' folder. With `ancestors`, a
        match of any folder above it (up to that folder) counts too."""
        root = self.root or Path.cwd().resolve()
        relative = _relative(path, root)
        inside = not Path(relative).is_absolute() and not relative.startswith("..")
        candidates = [Path(relative)]
        if ancestors and inside:
            candidates += [parent for parent in Path(relative).parents if parent != Path(".")]
        return any(
            (
                fnmatch(candidate.as_posix(), pattern.strip("/"))
                if "/" in pattern.strip("/")
                else fnmatch(candidate.name, pattern.strip("/"))
            )
            for pattern in self.exclude + self.extend_exclude
            for candidate in candidates
        )

    def applies_unsafe_fixes(self, code: str) -> bool:
        """Whether an unsafe fix of `code` is applied."""
        return self.unsafe_fixes or _matches(code, self.extend_safe_fixes)


def _matches(code: str, prefixes: tuple[str, ...]) -> bool:
    return any(code.startswith(prefix) for prefix in prefixes)


def _relative(path: Path, root: Path | None) -> str:
    resolved = real_path(path)
    if root is not None and resolved.is_relative_to(root):
        return resolved.relative_to(root).as_posix()
    return path.as_posix()


def _codes(value: Any, key: str, source: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: tool.autoaccel.{key} must be a list of rule codes")
    codes = tuple(v.upper() for v in value)
    check_selectors(codes, f"{source}: tool.autoaccel.{key}")
    return codes


# The rule codes `select`, `ignore` and the other selectors are checked against. The rule
# catalog sits above this layer: the `autoaccel` command registers it before any command
# reads settings (`autoaccel.__main__`).
_rule_codes: Callable[[], Iterable[str]] | None = None


def use_rule_catalog(codes: Callable[[], Iterable[str]]) -> None:
    """Check selectors against the codes `codes()` returns (called when first needed)."""
    global _rule_codes
    _rule_codes = codes


def check_selectors(codes: tuple[str, ...], where: str) -> None:
    """Raise `ConfigError` for the first of `codes` (codes or prefixes) that selects no
    rule, as Ruff does, naming the closest rule code. Without a registered catalog
    (`use_rule_catalog`), nothing is checked."""
    if not codes or _rule_codes is None:
        return
    known = list(_rule_codes())
    for code in codes:
        if not any(known_code.startswith(code) for known_code in known):
            raise ConfigError(f"{where}: unknown rule selector `{code}`{_suggestion(code, known)}")


def _suggestion(word: str, known: list[str]) -> str:
    """`, did you mean `x`?` naming the closest of `known`, or nothing."""
    import difflib

    close = difflib.get_close_matches(word, known, n=1, cutoff=0.75)
    return f", did you mean `{close[0]}`?" if close else ""


def unknown_key_error(where: str, key: str, known: list[str]) -> ConfigError:
    """The error for `key` of the table `where` (`file: tool.autoaccel`) that is not a
    setting, naming the closest known key."""
    return ConfigError(
        f"{where}.{key}: unknown key{_suggestion(key, known)} (known: {', '.join(known)})"
    )


# The keys of [tool.autoaccel]: Ruff's lint selection, and the convert defaults table.
TOOL_KEYS = [
    "select",
    "extend-select",
    "ignore",
    "per-file-ignores",
    "exclude",
    "extend-exclude",
    "force-exclude",
    "convert",
]


def _patterns(value: Any, key: str, source: Path) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: tool.autoaccel.{key} must be a list of glob patterns")
    return tuple(value)


def read_tool_table(pyproject: Path) -> dict[str, Any] | None:
    """The `[tool.autoaccel]` table of `pyproject`, or None when it has none. An unknown
    key or rule code in it is an error for every command, as in Ruff."""
    if sys.version_info >= (3, 11):  # imported here: a run without a pyproject.toml skips it
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        data = tomllib.loads(read_bytes(pyproject).decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{pyproject}: not UTF-8 ({error.reason} at byte {error.start})"
        ) from None
    except OSError as error:
        raise ConfigError(f"{pyproject}: {os_error_message(error)}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{pyproject}: {error}") from None
    except RecursionError:  # tomllib recurses once per level of `[[[...]]]` or `{a={...}}`
        raise ConfigError(f"{pyproject}: nested too deeply to read") from None
    table = data.get("tool", {}).get("autoaccel")
    if not isinstance(table, dict):
        return None
    for key in table:
        if key not in TOOL_KEYS:
            raise unknown_key_error(f"{pyproject}: tool.autoaccel", key, TOOL_KEYS)
    settings_from_table(table, pyproject)
    return table


@functools.cache
def find_config(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The nearest pyproject.toml at or above `directory` with a [tool.autoaccel] table.
    One that is not a regular file (a folder, a FIFO) is passed over with a warning."""
    for folder in (directory, *directory.parents):
        candidate = folder / "pyproject.toml"
        try:
            mode = os.stat(candidate).st_mode
        except OSError:  # none, or in a folder that may not be searched (its walk says so)
            continue
        if not stat.S_ISREG(mode):
            warning = f"warning: {candidate}: {file_kind(mode)}; its settings are not read"
            print(warning, file=sys.stderr)
            continue
        table = read_tool_table(candidate)
        if table is not None:
            return candidate, table
    return None


def settings_from_table(table: dict[str, Any], source: Path) -> LintSettings:
    settings = LintSettings(root=source.parent.resolve())
    if "select" in table:
        codes = _codes(table["select"], "select", source)
        settings = replace(settings, select=codes, select_configured=True)
    if "extend-select" in table:
        extra = _codes(table["extend-select"], "extend-select", source)
        settings = replace(settings, select=settings.select + extra)
    if "ignore" in table:
        settings = replace(settings, ignore=_codes(table["ignore"], "ignore", source))
    for key in ("exclude", "extend-exclude"):
        if key in table:
            settings = replace(
                settings, **{key.replace("-", "_"): _patterns(table[key], key, source)}
            )
    if "force-exclude" in table:
        force = checked(table["force-exclude"], bool, f"{source}: tool.autoaccel.force-exclude")
        settings = replace(settings, force_exclude=force)
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
    found = config_for(path)
    if found is None:
        return LintSettings()
    return settings_from_table(found[1], found[0])


# -- where each value comes from (`autoaccel config`, `autoaccel convert`) ------------------
DEFAULT, COMMAND_LINE = "default", "command line"


@dataclass(frozen=True)
class Sourced:
    """A setting's value and where it came from: `default`, a pyproject.toml path,
    or `command line`."""

    value: Any
    source: str


def config_for(path: Path) -> tuple[Path, dict[str, Any]] | None:
    """The pyproject.toml that applies to `path` (a file or a folder) and its table."""
    start = real_path(path)
    return find_config(start if os.path.isdir(start) else start.parent)


def lint_settings_with_sources(path: Path) -> dict[str, Sourced]:
    """The lint keys in effect for `path` (validated), each with its source."""
    found = config_for(path)
    table, source = (found[1], found[0]) if found else ({}, None)
    defaults = {
        "select": list(LintSettings().select),
        "extend-select": [],
        "ignore": [],
        "per-file-ignores": {},
        "exclude": list(DEFAULT_EXCLUDE),
        "extend-exclude": [],
        "force-exclude": False,
    }
    return {
        key: Sourced(table[key], str(source)) if key in table else Sourced(default, DEFAULT)
        for key, default in defaults.items()
    }


def checked(value: Any, hint: Any, where: str) -> Any:
    """`value`, when it fits the type `hint` (a `Literal`, or `bool`); else a `ConfigError`
    naming `where` the value came from."""
    if get_origin(hint) is Literal:
        allowed = get_args(hint)
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(allowed)}")
    elif hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: {value!r} is not true or false")
    return value
