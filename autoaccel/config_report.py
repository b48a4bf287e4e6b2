"""`autoaccel config`: the effective settings for a path, written as the pyproject.toml
tables they come from, each value commented with its source."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from autoaccel.config import Sourced, config_for, lint_settings_with_sources
from autoaccel.convert.settings import convert_settings


def effective_config(path: Path, command_line: Mapping[str, Any] | None = None) -> str:
    """The lint and convert settings for `path`; `command_line` holds convert options
    given on the command line (field name -> value). Raises `ConfigError`."""
    found = config_for(path)
    lint = lint_settings_with_sources(path)
    convert = {
        name.replace("_", "-"): setting
        for name, setting in convert_settings(path, command_line).items()
    }
    header = [
        f"# autoaccel settings for {path}",
        f"# from {found[0]}" if found else "# no pyproject.toml with [tool.autoaccel]: defaults",
    ]
    return (
        "\n".join(
            [
                *header,
                "",
                *_table("tool.autoaccel", lint),
                "",
                *_table("tool.autoaccel.convert", convert),
            ]
        )
        + "\n"
    )


def _table(name: str, settings: dict[str, Sourced]) -> list[str]:
    assignments = {key: f"{key} = {_toml(setting.value)}" for key, setting in settings.items()}
    width = max(map(len, assignments.values()))
    return [f"[{name}]"] + [
        f"{assignments[key].ljust(width)}  # {setting.source}" for key, setting in settings.items()
    ]


def _toml(value: Any) -> str:
    """A TOML inline value (strings, booleans, lists and tables of them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_toml, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)
