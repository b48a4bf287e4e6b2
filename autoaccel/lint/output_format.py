"""The report formats `autoaccel lint --format` accepts (kept import-light for the CLI)."""

from enum import Enum


class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    github = "github"
    sarif = "sarif"
