"""`--format json|github|sarif`: what CI systems and GitHub code scanning read."""

from __future__ import annotations

import json
import re
from urllib.parse import unquote

import pytest
from conftest import CLEAN, SCRIPT, SELECT

from autoaccel.lint.output_format import OutputFormat
from autoaccel.rules import all_rules


@pytest.fixture
def project(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(SCRIPT)
    (tmp_path / "clean.py").write_text(CLEAN)
    return tmp_path


def test_json(cli, project):
    run = cli("lint", *SELECT, "--format", "json", "src/train.py", "clean.py")
    assert run.exit_code == 1
    records = json.loads(run.stdout)
    assert [r["code"] for r in records] == ["ACC101", "ACC102"]
    first = records[0]
    assert first["name"] == "dataloader-without-workers"
    assert first["filename"] == "src/train.py"
    assert first["location"] == {"row": 4, "column": 10}
    assert first["end_location"] == {"row": 4, "column": 44}
    assert first["fix"]["applicability"] == "unsafe"
    assert records[1]["fix"] == {
        "message": "Add `pin_memory=torch.cuda.is_available()`",
        "applicability": "safe",
    }
    assert first["url"].endswith("/rules/ACC101-dataloader-without-workers.md")
    assert run.stderr == ""  # no text summary mixed into machine output


def test_json_without_findings_is_an_empty_list(cli, project):
    run = cli("lint", *SELECT, "--format", "json", "clean.py")
    assert (run.exit_code, json.loads(run.stdout)) == (0, [])


def test_github_annotations(cli, project):
    run = cli("lint", *SELECT, "--output-format", "github", "src/train.py")
    assert run.stdout.splitlines() == [
        "::error title=autoaccel (ACC101),file=src/train.py,line=4,col=10,endLine=4,"
        "endColumn=44::ACC101 `DataLoader` loads batches in the main process (`num_workers=0`)",
        "::error title=autoaccel (ACC102),file=src/train.py,line=4,col=10,endLine=4,"
        "endColumn=44::ACC102 `DataLoader` feeding CUDA does not pin memory (`pin_memory=False`)",
    ]


def test_github_escapes_property_values(cli, tmp_path):
    (tmp_path / "a,b:c.py").write_text(SCRIPT)
    run = cli("lint", "--select", "ACC101", "--format", "github", "a,b:c.py")
    assert "file=a%2Cb%3Ac.py," in run.stdout


def test_sarif_has_what_github_code_scanning_requires(cli, project):
    run = cli("lint", *SELECT, "--format", "sarif", "src/train.py", "clean.py")
    assert run.exit_code == 1
    document = json.loads(run.stdout)
    assert document["version"] == "2.1.0"
    assert document["$schema"].endswith("sarif-2.1.0.json")
    (sarif_run,) = document["runs"]
    driver = sarif_run["tool"]["driver"]
    assert driver["name"] == "autoaccel"
    assert driver["version"]
    rules = driver["rules"]
    assert [r["id"] for r in rules] == [rule.code for rule in all_rules()]
    for rule in rules:
        assert rule["shortDescription"]["text"]
        assert rule["fullDescription"]["text"]
        assert rule["help"]["text"]
        assert rule["help"]["markdown"]
        assert rule["helpUri"].startswith("https://")
        assert rule["defaultConfiguration"]["level"] in {"note", "warning", "error"}
    assert rules[0]["help"]["text"].startswith("# ACC101 dataloader-without-workers\n")
    results = sarif_run["results"]
    assert [r["ruleId"] for r in results] == ["ACC101", "ACC102"]
    for result in results:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["message"]["text"]
        assert result["level"] in {"note", "warning", "error"}
        (location,) = result["locations"]
        physical = location["physicalLocation"]
        assert physical["artifactLocation"]["uri"] == "src/train.py"
        region = physical["region"]
        assert (region["startLine"], region["startColumn"]) == (4, 10)
        assert region["endLine"] >= region["startLine"]


def test_sarif_without_findings_still_describes_the_tool(cli, project):
    run = cli("lint", *SELECT, "--format", "sarif", "clean.py")
    document = json.loads(run.stdout)
    assert run.exit_code == 0
    assert document["runs"][0]["results"] == []
    assert document["runs"][0]["tool"]["driver"]["rules"]


def test_unknown_format_is_a_usage_error(cli, project):
    run = cli("lint", "--format", "xml", "clean.py")
    assert run.exit_code == 2


# File names a pull request can choose: each must stay one name in every format, and run
# nothing (shared with the PR comment's test in test_ci_security.py).
HOSTILE_NAMES = [
    "new\nline.py",
    "cr\rname.py",
    "back`tick.py",
    "a\n```\n# Heading <img src=x onerror=alert(1)>\n```\nb.py",
    "a`<img src=x onerror=alert(1)>`b.py",
    "<img src=x onerror=alert(1)>.py",
    "$(touch pwned).py",
    "-o.py",
    "--write.py",
    "100%,a:b.py",
    "|pipe|.py",
]
# A property value of a workflow command: `%`, CR, LF, `:` and `,` escaped, nothing raw.
_GITHUB_FILE = re.compile(
    r"::error title=autoaccel \(ACC10[12]\),file=(?P<file>(?:[^%,:\r\n]|%(?:25|0D|0A|3A|2C))*),"
    r"line=4,col=10,endLine=4,endColumn=44::ACC10[12] [^\r\n]*"
)
_GITHUB_ESCAPES = {"%25": "%", "%0D": "\r", "%0A": "\n", "%3A": ":", "%2C": ","}


def reported_names(output_format: str, output: str) -> list[str]:
    """The file name of each finding in `output`, as a reader of the format gets it."""
    if output_format == "json":
        return [record["filename"] for record in json.loads(output)]
    if output_format == "sarif":
        (sarif_run,) = json.loads(output)["runs"]
        locations = [result["locations"][0]["physicalLocation"] for result in sarif_run["results"]]
        return [unquote(location["artifactLocation"]["uri"]) for location in locations]
    if output_format == "github":
        files = [_GITHUB_FILE.fullmatch(line)["file"] for line in output.split("\n")[:-1]]
        return [re.sub("%(25|0D|0A|3A|2C)", lambda m: _GITHUB_ESCAPES[m[0]], f) for f in files]
    # text: one line per finding, in every reader's sense of a line (a CR ends one too),
    # the control characters of a name written as escapes
    return [
        line.split(":4:10: ACC10")[0].encode().decode("unicode_escape")
        for line in output.splitlines()
    ]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=ascii)
@pytest.mark.parametrize("output_format", [member.value for member in OutputFormat])
def test_a_hostile_file_name_is_one_name_in_every_format(cli, tmp_path, output_format, name):
    (tmp_path / name).write_text(SCRIPT)
    run = cli("lint", *SELECT, "--format", output_format, "--", name)
    assert run.exit_code == 1, run.stderr
    assert reported_names(output_format, run.stdout) == [name, name]
    assert sorted(path.name for path in tmp_path.iterdir()) == [name]  # nothing ran or wrote
