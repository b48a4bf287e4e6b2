"""The options of `autoaccel convert` for a path: defaults, `[tool.autoaccel.convert]` of
the nearest pyproject.toml (one key per `ConvertOptions` field, kebab-case), the command line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints

from autoaccel.config import (
    COMMAND_LINE,
    DEFAULT,
    ConfigError,
    Sourced,
    checked,
    config_for,
    unknown_key_error,
)
from autoaccel.convert.log import ConvertOptions

_FLAGS = {"target": "--to"}  # command-line spellings that differ from `--field-name`


def _flag(name: str) -> str:
    """The command-line flag of a `ConvertOptions` field."""
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def convert_settings(
    path: Path, command_line: Mapping[str, Any] | None = None
) -> dict[str, Sourced]:
    """Every `ConvertOptions` field for converting `path`: defaults, overridden by
    `[tool.autoaccel.convert]` of the nearest pyproject.toml, overridden by `command_line`
    (field name -> value). Raises `ConfigError` for unknown keys and invalid values."""
    hints = get_type_hints(ConvertOptions)
    settings = {f.name: Sourced(f.default, DEFAULT) for f in fields(ConvertOptions)}
    found = config_for(path)
    if found is not None:
        source, table = found
        convert_table = table.get("convert", {})
        if not isinstance(convert_table, dict):
            raise ConfigError(f"{source}: tool.autoaccel.convert must be a table")
        for key, value in convert_table.items():
            name = key.replace("-", "_")
            where = f"{source}: tool.autoaccel.convert.{key}"
            if name not in settings:
                known = [n.replace("_", "-") for n in settings]
                raise unknown_key_error(f"{source}: tool.autoaccel.convert", key, known)
            settings[name] = Sourced(checked(value, hints[name], where), str(source))
    for name, value in (command_line or {}).items():
        settings[name] = Sourced(checked(value, hints[name], _flag(name)), COMMAND_LINE)
    return settings


def convert_options(path: Path, command_line: Mapping[str, Any] | None = None) -> ConvertOptions:
    """The options `autoaccel convert` uses for `path` (see `convert_settings`)."""
    settings = convert_settings(path, command_line)
    return ConvertOptions(**{name: setting.value for name, setting in settings.items()})
