"""Rule selection: `--select/--ignore/--extend-select` and `[tool.autoaccel]`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import SCRIPT

from autoaccel.config import ConfigError, LintSettings, settings_for


def codes(stdout: str) -> list[str]:
    return [line.split(": ")[1].split()[0] for line in stdout.splitlines()]


def write_config(folder: Path, body: str) -> None:
    (folder / "pyproject.toml").write_text("[project]\nname = 'x'\n\n" + textwrap.dedent(body))


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--select", "ACC101"], ["ACC101"]),
        (["--select", "ACC102,ACC101"], ["ACC101", "ACC102"]),
        (["--select", "ACC101", "--select", "ACC102"], ["ACC101", "ACC102"]),
        (["--select", "acc10"], ["ACC101", "ACC102"]),  # a prefix, any case
        (["--select", "ACC10", "--ignore", "ACC102"], ["ACC101"]),
        (["--select", "ACC101,ACC102", "--ignore", "ACC1"], []),
        (["--select", "ACC101", "--extend-select", "ACC102"], ["ACC101", "ACC102"]),
        (["--select", "ACC2"], []),
    ],
)
def test_select_ignore_extend_select(cli, tmp_path, options, expected):
    (tmp_path / "train.py").write_text(SCRIPT)
    run = cli("lint", *options, "train.py")
    assert codes(run.stdout) == expected
    assert run.exit_code == (1 if expected else 0)


def test_pyproject_select_and_ignore(cli, tmp_path):
    write_config(tmp_path, '[tool.autoaccel]\nselect = ["ACC10"]\nignore = ["ACC101"]\n')
    (tmp_path / "train.py").write_text(SCRIPT)
    assert codes(cli("lint", "train.py").stdout) == ["ACC102"]


def test_pyproject_extend_select(cli, tmp_path):
    write_config(tmp_path, '[tool.autoaccel]\nselect = ["ACC101"]\nextend-select = ["ACC102"]\n')
    (tmp_path / "train.py").write_text(SCRIPT)
    assert codes(cli("lint", "train.py").stdout) == ["ACC101", "ACC102"]


def test_command_line_select_replaces_config_select(cli, tmp_path):
    write_config(tmp_path, '[tool.autoaccel]\nselect = ["ACC101"]\n')
    (tmp_path / "train.py").write_text(SCRIPT)
    assert codes(cli("lint", "--select", "ACC102", "train.py").stdout) == ["ACC102"]


def test_command_line_ignore_adds_to_config_ignore(cli, tmp_path):
    write_config(tmp_path, '[tool.autoaccel]\nselect = ["ACC10"]\nignore = ["ACC101"]\n')
    (tmp_path / "train.py").write_text(SCRIPT)
    assert codes(cli("lint", "train.py").stdout) == ["ACC102"]
    assert codes(cli("lint", "--ignore", "ACC102", "train.py").stdout) == []


def test_per_file_ignores_with_globs(cli, tmp_path):
    write_config(
        tmp_path,
        """\
        [tool.autoaccel]
        select = ["ACC101", "ACC102"]
        exclude = []  # lint tests/ too

        [tool.autoaccel.per-file-ignores]
        "experiments/*.py" = ["ACC101"]
        "legacy_*.py" = ["ACC1"]
        "checks/**" = ["ACC102"]
        """,
    )
    for name in (
        "train.py",
        "experiments/run.py",
        "legacy_old.py",
        "lib/legacy_x.py",
        "checks/deep/t.py",
    ):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(SCRIPT)
    run = cli("lint", ".")
    found = {}
    for line in run.stdout.splitlines():
        path, _, _, rest = line.split(":", 3)
        found.setdefault(Path(path).as_posix(), []).append(rest.split()[0])
    assert found == {
        "train.py": ["ACC101", "ACC102"],
        "experiments/run.py": ["ACC102"],
        "checks/deep/t.py": ["ACC101"],
    }


def test_nearest_pyproject_wins(cli, tmp_path):
    write_config(tmp_path, '[tool.autoaccel]\nselect = ["ACC101"]\n')
    (tmp_path / "pkg").mkdir()
    write_config(tmp_path / "pkg", '[tool.autoaccel]\nselect = ["ACC102"]\n')
    (tmp_path / "top.py").write_text(SCRIPT)
    (tmp_path / "pkg" / "inner.py").write_text(SCRIPT)
    run = cli("lint", "top.py", "pkg/inner.py")
    assert run.stdout.splitlines()[0].startswith("pkg/inner.py:4:10: ACC102")
    assert codes(run.stdout) == ["ACC102", "ACC101"]


def test_pyproject_without_our_table_is_passed_over(tmp_path):
    write_config(tmp_path, '[tool.autoaccel]\nignore = ["ACC102"]\n')
    (tmp_path / "pkg").mkdir()
    write_config(tmp_path / "pkg", "[tool.black]\nline-length = 100\n")
    settings = settings_for(tmp_path / "pkg" / "train.py")
    assert settings.ignore == ("ACC102",)
    assert settings.root == tmp_path.resolve()


def test_no_config_gives_defaults(tmp_path):
    assert settings_for(tmp_path / "train.py") == LintSettings()


@pytest.mark.parametrize(
    "body",
    [
        '[tool.autoaccel]\nselect = "ACC101"\n',
        "[tool.autoaccel\n",
        '[tool.autoaccel]\nper-file-ignores = ["x"]\n',
    ],
)
def test_bad_config_is_an_error_naming_the_file(cli, tmp_path, body):
    write_config(tmp_path, body)
    (tmp_path / "train.py").write_text(SCRIPT)
    run = cli("lint", "train.py")
    assert run.exit_code == 2
    assert "pyproject.toml" in run.stderr
    with pytest.raises(ConfigError):
        settings_for(tmp_path / "train.py")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            'ignor = ["ACC101"]',
            "tool.autoaccel.ignor: unknown key, did you mean `ignore`? (known: ",
        ),
        (
            'extend_select = ["ACC1"]',
            "tool.autoaccel.extend_select: unknown key, did you mean `extend-select`?",
        ),
        ("colour = true", "tool.autoaccel.colour: unknown key (known: select, extend-select,"),
        (
            'ignore = ["ACC1O1"]',
            "tool.autoaccel.ignore: unknown rule selector `ACC1O1`, did you mean `ACC101`?",
        ),
    ],
)
def test_unknown_key_or_code_in_the_table_is_an_error(cli, tmp_path, body, message):
    write_config(tmp_path, f"[tool.autoaccel]\n{body}\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "other.py").write_text(SCRIPT)
    run = cli("lint", "train.py", "other.py")
    assert (run.exit_code, run.stdout) == (2, "")
    assert run.stderr.startswith(f"error: {tmp_path / 'pyproject.toml'}: {message}")
    assert run.stderr.count("\n") == 1  # said once, not once per file
    assert cli("convert", "train.py").exit_code == 2  # every command reads the table


@pytest.mark.parametrize("nesting", ["select = {}", "convert = {{ target = {} }}"])
def test_a_pyproject_nested_too_deeply_is_an_error_naming_the_file(cli, tmp_path, nesting):
    deep = "[" * 5000 + "]" * 5000
    (tmp_path / "pyproject.toml").write_text(f"[tool.autoaccel]\n{nesting.format(deep)}\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    expected = f"error: {tmp_path / 'pyproject.toml'}: nested too deeply to read\n"
    for command in ("lint", "convert"):
        run = cli(command, "train.py")
        assert (run.exit_code, run.stderr) == (2, expected)


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        pytest.param(Path.mkdir, "a directory", id="folder"),
        pytest.param(os.mkfifo, "a FIFO", id="fifo"),
    ],
)
def test_a_pyproject_that_is_not_a_regular_file_is_passed_over_with_a_warning(
    cli, tmp_path, make, kind
):
    (tmp_path / "sub").mkdir()
    write_config(tmp_path, '[tool.autoaccel]\nselect = ["ACC101"]\n')
    make(tmp_path / "sub" / "pyproject.toml")  # a FIFO is never opened: nothing blocks
    (tmp_path / "sub" / "train.py").write_text(SCRIPT)
    run = cli("lint", "sub/train.py")
    assert codes(run.stdout) == ["ACC101"]  # the settings of the folder above
    warning = f"warning: {tmp_path / 'sub' / 'pyproject.toml'}: {kind}; its settings are not read"
    assert run.stderr.splitlines()[0] == warning


def test_enabled_matches_prefixes():
    settings = LintSettings(select=("ACC1", "ACC301"), ignore=("ACC10",))
    assert not settings.enabled("ACC101")
    assert settings.enabled("ACC110")
    assert settings.enabled("ACC301")
    assert not settings.enabled("ACC302")


ADAM = "import torch\nopt = torch.optim.Adam(model.parameters(), weight_decay=1e-4)\n"


@pytest.mark.parametrize(
    ("args", "reported"),
    [
        ((), False),  # opt-in: the default `ACC` selection leaves it out
        (("--select", "ACC5"), False),  # so does a prefix
        (("--select", "ACC505"), True),
        (("--extend-select", "ACC505"), True),
    ],
)
def test_an_opt_in_rule_runs_only_when_named_in_full(cli, tmp_path, args, reported):
    (tmp_path / "train.py").write_text(ADAM)
    run = cli("lint", "train.py", *args)
    assert ("ACC505" in run.stdout) is reported, run.stdout


@pytest.mark.parametrize("command", [("lint", "train.py"), ("convert", "train.py", "--no-run")])
def test_the_installed_command_checks_the_table_s_rule_codes(tmp_path, command):
    """The config loader sits below the rule catalog: the `autoaccel` command hands it the
    catalog (`config.use_rule_catalog`) before any command reads settings, also on the
    plain lint call that skips typer (the pre-commit hook's)."""
    write_config(tmp_path, '[tool.autoaccel]\nignore = ["ACC1O1"]\n')
    (tmp_path / "train.py").write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "autoaccel", *command],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "unknown rule selector `ACC1O1`, did you mean `ACC101`?" in proc.stderr
