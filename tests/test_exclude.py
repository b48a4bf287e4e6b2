"""Test code is not training code: directory walks skip it by default, Ruff's way
(`exclude`, `extend-exclude`, `force-exclude`)."""

from __future__ import annotations

import pytest

from conftest import SCRIPT, SELECT

# A unit test's loader that would be reported in a training script.
TEST_CODE = SCRIPT.replace("DataLoader(dataset, batch_size=32)", "DataLoader(Mock())")
TEST_FILES = ("tests/helpers.py", "pkg/test_data.py", "pkg/data_test.py", "conftest.py")


@pytest.fixture
def project(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    for name in TEST_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(TEST_CODE)
    return tmp_path


def linted_files(run) -> set[str]:
    return {line.split(":")[0].replace("\\", "/") for line in run.stdout.splitlines()}


def test_test_code_is_not_linted_by_default(cli, project):
    assert linted_files(cli("lint", *SELECT, ".")) == {"train.py"}


def test_exclude_replaces_the_default(cli, project):
    (project / "pyproject.toml").write_text("[tool.autoaccel]\nexclude = []\n")
    assert linted_files(cli("lint", *SELECT, ".")) == {"train.py", *TEST_FILES}


def test_extend_exclude_adds_patterns(cli, project):
    (project / "pyproject.toml").write_text(
        '[tool.autoaccel]\nextend-exclude = ["train.py", "pkg/*.py"]\n'
    )
    assert cli("lint", *SELECT, ".").stdout == ""


def test_a_file_named_on_the_command_line_is_linted_unless_forced(cli, project):
    assert linted_files(cli("lint", *SELECT, "tests/helpers.py")) == {"tests/helpers.py"}
    assert linted_files(cli("lint", *SELECT, "--force-exclude", "tests/helpers.py")) == set()
    (project / "pyproject.toml").write_text("[tool.autoaccel]\nforce-exclude = true\n")
    assert linted_files(cli("lint", *SELECT, "train.py", "pkg/test_data.py")) == {"train.py"}


def test_exclude_must_be_a_list_of_patterns(cli, project):
    (project / "pyproject.toml").write_text('[tool.autoaccel]\nexclude = "tests"\n')
    run = cli("lint", *SELECT, ".")
    assert run.exit_code == 2
    assert "tool.autoaccel.exclude must be a list of glob patterns" in run.stderr
