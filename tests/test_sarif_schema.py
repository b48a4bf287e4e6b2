"""`--format sarif` against the SARIF 2.1.0 rules GitHub code scanning applies on upload.

The checks are written from the SARIF 2.1.0 specification (OASIS) and GitHub's "SARIF
support for code scanning" page (required properties and limits), not from a copied schema
file: the validator below is the subset those two documents make mandatory, plus the
value constraints of the schema for every property autoaccel writes.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from conftest import SCRIPT

ROOT = Path(__file__).resolve().parent.parent
LEVELS = {"none", "note", "warning", "error"}
GITHUB_MAX_RUNS = 20
GITHUB_MAX_RESULTS_PER_RUN = 25_000
GITHUB_MAX_DESCRIPTION = 1024  # shortDescription.text and fullDescription.text
GITHUB_MAX_TAGS = 20
URI_REFERENCE = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")  # RFC 3986 characters


def sarif_errors(document: dict[str, Any]) -> list[str]:
    """Everything in `document` that a SARIF 2.1.0 consumer or GitHub would reject."""
    errors: list[str] = []

    def need(condition: bool, where: str, what: str) -> bool:
        if not condition:
            errors.append(f"{where}: {what}")
        return condition

    def text(value: Any, where: str, limit: int | None = None) -> None:
        if (
            need(
                isinstance(value, dict) and isinstance(value.get("text"), str) and value["text"],
                where,
                "needs a non-empty `text`",
            )
            and limit
        ):
            need(len(value["text"]) <= limit, where, f"longer than {limit} characters")

    def absolute_uri(value: Any, where: str) -> None:
        need(isinstance(value, str) and bool(urlparse(value).scheme), where, "not an absolute URI")

    need(document.get("version") == "2.1.0", "version", "must be 2.1.0")
    need(
        str(document.get("$schema", "")).endswith("sarif-2.1.0.json"), "$schema", "not SARIF 2.1.0"
    )
    runs = document.get("runs")
    if not need(isinstance(runs, list) and 0 < len(runs) <= GITHUB_MAX_RUNS, "runs", "1-20 runs"):
        return errors
    for r, run in enumerate(runs):
        driver = run.get("tool", {}).get("driver")
        if not need(isinstance(driver, dict), f"runs[{r}].tool.driver", "required"):
            continue
        need(
            isinstance(driver.get("name"), str) and driver["name"],
            f"runs[{r}].driver.name",
            "required",
        )
        absolute_uri(driver.get("informationUri"), f"runs[{r}].driver.informationUri")
        need(
            run.get("columnKind", "utf16CodeUnits") in {"utf16CodeUnits", "unicodeCodePoints"},
            f"runs[{r}].columnKind",
            "unknown column kind",
        )
        for name, base in run.get("originalUriBaseIds", {}).items():
            absolute_uri(base.get("uri"), f"originalUriBaseIds.{name}")
            need(base.get("uri", "").endswith("/"), f"originalUriBaseIds.{name}", "must end with /")
        rules = driver.get("rules", [])
        ids = [rule.get("id") for rule in rules]
        need(len(ids) == len(set(ids)), f"runs[{r}].driver.rules", "rule ids must be unique")
        for i, rule in enumerate(rules):
            where = f"rules[{i}]"
            need(isinstance(rule.get("id"), str) and rule["id"], f"{where}.id", "required")
            text(rule.get("shortDescription"), f"{where}.shortDescription", GITHUB_MAX_DESCRIPTION)
            text(rule.get("fullDescription"), f"{where}.fullDescription", GITHUB_MAX_DESCRIPTION)
            text(rule.get("help"), f"{where}.help")
            absolute_uri(rule.get("helpUri"), f"{where}.helpUri")
            level = rule.get("defaultConfiguration", {}).get("level", "warning")
            need(level in LEVELS, f"{where}.defaultConfiguration.level", f"{level!r} not a level")
            tags = rule.get("properties", {}).get("tags", [])
            need(len(tags) <= GITHUB_MAX_TAGS, f"{where}.properties.tags", "at most 20 tags")
        results = run.get("results")
        if not need(isinstance(results, list), f"runs[{r}].results", "required"):
            continue
        need(len(results) <= GITHUB_MAX_RESULTS_PER_RUN, f"runs[{r}].results", "too many")
        for k, result in enumerate(results):
            where = f"results[{k}]"
            text(result.get("message"), f"{where}.message")
            if need(result.get("ruleId") in ids, f"{where}.ruleId", "not a rule of the driver"):
                index = result.get("ruleIndex", ids.index(result["ruleId"]))
                need(ids[index] == result["ruleId"], f"{where}.ruleIndex", "points at another rule")
            need(result.get("level", "warning") in LEVELS, f"{where}.level", "not a level")
            fingerprints = result.get("partialFingerprints", {})
            need(
                all(isinstance(v, str) for v in fingerprints.values()),
                f"{where}.partialFingerprints",
                "values must be strings",
            )
            locations = result.get("locations")
            if not need(
                isinstance(locations, list) and locations, f"{where}.locations", "required"
            ):
                continue
            for location in locations:
                physical = location.get("physicalLocation", {})
                uri = physical.get("artifactLocation", {}).get("uri")
                if need(
                    isinstance(uri, str) and URI_REFERENCE.fullmatch(uri),
                    f"{where}.uri",
                    f"{uri!r} is not a URI reference",
                ):
                    need(
                        bool(urlparse(uri).scheme) or not uri.startswith("/"),
                        f"{where}.uri",
                        "a relative URI must be relative to the repository root",
                    )
                region = physical.get("region", {})
                start, end = region.get("startLine"), region.get("endLine", region.get("startLine"))
                if need(isinstance(start, int) and start >= 1, f"{where}.region.startLine", ">= 1"):
                    need(
                        isinstance(end, int) and end >= start, f"{where}.region.endLine", ">= start"
                    )
                column = region.get("startColumn", 1)
                end_column = region.get("endColumn", column)
                need(isinstance(column, int) and column >= 1, f"{where}.region.startColumn", ">= 1")
                need(end != start or end_column >= column, f"{where}.region.endColumn", ">= start")
    return errors


def sarif(cli, *paths: str) -> dict[str, Any]:
    run = cli("lint", "--format", "sarif", *paths)
    assert run.exit_code in (0, 1), run.stderr
    return json.loads(run.stdout)


@pytest.fixture
def project(tmp_path):
    for fixture in sorted((ROOT / "fixtures").glob("*.py")):
        shutil.copy(fixture, tmp_path / fixture.name)
    shutil.copy(ROOT / "fixtures" / "notebooks" / "train.ipynb", tmp_path / "explore.ipynb")
    return tmp_path


def test_fixtures_and_a_notebook_give_valid_sarif(cli, project):
    document = sarif(cli, ".")
    assert sarif_errors(document) == []
    results = document["runs"][0]["results"]
    assert len(results) > 20
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results}
    assert {"cnn_toplevel.py", "explore.ipynb"} <= uris


def test_rule_help_is_the_rule_doc_from_rules(cli, project):
    rules = sarif(cli, "explore.ipynb")["runs"][0]["tool"]["driver"]["rules"]
    for rule in rules:
        doc = ROOT / "rules" / f"{rule['id']}-{rule['name']}.md"
        assert rule["help"]["text"] == rule["help"]["markdown"] == doc.read_text()
        assert rule["helpUri"].endswith(f"/rules/{doc.name}")
        assert rule["fullDescription"]["text"] in " ".join(doc.read_text().split())


def test_notebook_results_point_into_the_ipynb_text(cli, project):
    document = sarif(cli, "explore.ipynb")
    lines = (project / "explore.ipynb").read_text().splitlines()
    for result in document["runs"][0]["results"]:
        region = result["locations"][0]["physicalLocation"]["region"]
        line = lines[region["startLine"] - 1]
        start, end = region["startColumn"] - 1, region["endColumn"] - 1
        assert line.lstrip().startswith('"')  # inside a source string of the notebook
        assert re.search(r"\(cell \d+:\d+:\d+\)$", result["message"]["text"])
        if result["ruleId"] == "ACC101":
            assert line[start:end] == "DataLoader(dataset, batch_size=32, shuffle=True)"


def test_uris_are_repository_relative_and_escaped(cli, tmp_path):
    (tmp_path / "my scripts").mkdir()
    (tmp_path / "my scripts" / "train #1.py").write_text(SCRIPT)
    document = sarif(cli, str(tmp_path / "my scripts" / "train #1.py"))
    assert sarif_errors(document) == []
    location = document["runs"][0]["results"][0]["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {
        "uri": "my%20scripts/train%20%231.py",
        "uriBaseId": "%SRCROOT%",
    }
    base = document["runs"][0]["originalUriBaseIds"]["%SRCROOT%"]["uri"]
    assert base == tmp_path.resolve().as_uri() + "/"


def test_a_file_outside_the_working_directory_gets_a_file_uri(cli, tmp_path, monkeypatch):
    (tmp_path / "elsewhere.py").write_text(SCRIPT)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    document = sarif(cli, str(tmp_path / "elsewhere.py"))
    assert sarif_errors(document) == []
    uri = document["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"][
        "uri"
    ]
    assert uri == (tmp_path / "elsewhere.py").resolve().as_uri()


def test_columns_count_code_points_as_declared(cli, tmp_path):
    (tmp_path / "emoji.py").write_text(SCRIPT.replace("loader =", 'tag = "🚀"; loader ='))
    run = sarif(cli, "--select", "ACC101", "emoji.py")["runs"][0]
    assert run["columnKind"] == "unicodeCodePoints"
    region = run["results"][0]["locations"][0]["physicalLocation"]["region"]
    assert (
        region["startColumn"]
        == SCRIPT.splitlines()[3].index("DataLoader") + len('tag = "🚀"; ') + 1
    )


def test_the_validator_rejects_what_github_rejects(cli, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    good = sarif(cli, "train.py")
    breakages = {
        "version": lambda d: d.update(version="2.0.0"),
        "driver.name": lambda d: d["runs"][0]["tool"]["driver"].pop("name"),
        "help": lambda d: d["runs"][0]["tool"]["driver"]["rules"][0].pop("help"),
        "fullDescription": lambda d: d["runs"][0]["tool"]["driver"]["rules"][0].update(
            fullDescription={"text": "x" * 2000}
        ),
        "message": lambda d: d["runs"][0]["results"][0].update(message={}),
        "ruleId": lambda d: d["runs"][0]["results"][0].update(ruleId="XYZ1"),
        "uri": lambda d: d["runs"][0]["results"][0]["locations"][0]["physicalLocation"][
            "artifactLocation"
        ].update(uri="/abs path.py"),
        "startLine": lambda d: d["runs"][0]["results"][0]["locations"][0]["physicalLocation"][
            "region"
        ].update(startLine=0),
        "level": lambda d: d["runs"][0]["results"][0].update(level="fatal"),
    }
    for name, breakage in breakages.items():
        broken = copy.deepcopy(good)
        breakage(broken)
        assert sarif_errors(broken), f"breaking {name} went unnoticed"
