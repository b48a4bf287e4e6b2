"""`[tool.autoaccel.convert]` defaults, command-line precedence, and `autoaccel config`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from autoaccel.config import ConfigError
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.settings import convert_options, convert_settings

TRAIN = """\
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
model = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(dataset, batch_size=32, num_workers=2, pin_memory=True)
for x, y in loader:
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def write_pyproject(folder: Path, body: str) -> Path:
    path = folder / "pyproject.toml"
    path.write_text("[project]\nname = 'x'\n\n" + textwrap.dedent(body))
    return path


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def test_defaults_without_a_pyproject(tmp_path):
    assert convert_options(tmp_path / "train.py") == ConvertOptions()
    assert {s.source for s in convert_settings(tmp_path / "train.py").values()} == {"default"}


def test_pyproject_sets_convert_defaults_and_the_command_line_wins(tmp_path):
    pyproject = write_pyproject(
        tmp_path,
        """\
        [tool.autoaccel.convert]
        amp = "off"
        channels-last = true
        target = "ddp"
        """,
    )
    settings = convert_settings(tmp_path / "train.py", {"target": "dp"})
    assert settings["amp"].value == "off" and settings["amp"].source == str(pyproject)
    assert settings["channels_last"].value is True
    assert (settings["target"].value, settings["target"].source) == ("dp", "command line")
    assert (settings["launcher"].value, settings["launcher"].source) == ("torchrun", "default")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('amp = "fp8"', "tool.autoaccel.convert.amp: 'fp8' is not one of bf16, fp16, off"),
        ('compile = "yes"', "tool.autoaccel.convert.compile: 'yes' is not true or false"),
        (
            "worker = 4",
            "tool.autoaccel.convert.worker: unknown key, did you mean `workers`? (known: target,",
        ),
    ],
)
def test_invalid_convert_settings_name_the_file_and_key(tmp_path, body, message):
    pyproject = write_pyproject(tmp_path, f"[tool.autoaccel.convert]\n{body}\n")
    with pytest.raises(ConfigError) as error:
        convert_options(tmp_path / "train.py")
    assert str(error.value).startswith(f"{pyproject}: {message}")


def test_convert_uses_the_pyproject_defaults(cli, project):
    write_pyproject(project, '[tool.autoaccel.convert]\namp = "off"\ncompile = true\n')
    run = cli("convert", "train.py")
    assert run.exit_code == 0, run.stderr
    assert "torch.autocast" not in run.stdout
    assert "+model.compile()" in run.stdout
    overridden = cli("convert", "train.py", "--amp", "bf16", "--no-compile")
    assert "torch.autocast(" in overridden.stdout
    assert "compile()" not in overridden.stdout


def test_convert_with_an_invalid_pyproject_exits_2_naming_the_file(cli, project):
    pyproject = write_pyproject(project, '[tool.autoaccel.convert]\nlauncher = "mpirun"\n')
    run = cli("convert", "train.py")
    assert run.exit_code == 2
    assert f"{pyproject}: tool.autoaccel.convert.launcher: 'mpirun' is not one of" in run.stderr


def test_config_prints_values_and_their_sources(cli, project):
    pyproject = write_pyproject(
        project,
        """\
        [tool.autoaccel]
        ignore = ["ACC505"]

        [tool.autoaccel.per-file-ignores]
        "legacy_*.py" = ["ACC5"]

        [tool.autoaccel.convert]
        amp = "off"
        """,
    )
    run = cli("config", "train.py", "--to", "ddp", "--compile")
    assert run.exit_code == 0, run.stderr
    assert run.stdout.splitlines() == [
        "# autoaccel settings for train.py",
        f"# from {pyproject}",
        "",
        "[tool.autoaccel]",
        'select = ["ACC"]                                              # default',
        "extend-select = []                                            # default",
        f'ignore = ["ACC505"]                                           # {pyproject}',
        f'per-file-ignores = {{"legacy_*.py" = ["ACC5"]}}                 # {pyproject}',
        'exclude = ["tests", "test_*.py", "*_test.py", "conftest.py"]  # default',
        "extend-exclude = []                                           # default",
        "force-exclude = false                                         # default",
        "",
        "[tool.autoaccel.convert]",
        'target = "ddp"             # command line',
        f'amp = "off"                # {pyproject}',
        "compile = true             # command line",
        "channels-last = false      # default",
        'workers = "auto"           # default',
        "sync-bn = false            # default",
        "per-process-batch = false  # default",
        'launcher = "torchrun"      # default',
        "cpu-offload = false        # default",
    ]


def test_config_without_a_pyproject_says_so(cli, tmp_path):
    run = cli("config")
    assert run.exit_code == 0
    assert run.stdout.splitlines()[1] == "# no pyproject.toml with [tool.autoaccel]: defaults"


@pytest.mark.parametrize(
    ("body", "args", "message"),
    [
        ('[tool.autoaccel]\nselect = "ACC1"\n', [], "tool.autoaccel.select must be a list"),
        ("[tool.autoaccel]\nconvert = 3\n", [], "tool.autoaccel.convert must be a table"),
        ("[tool.autoaccel]\n", ["--amp", "fp8"], "--amp: 'fp8' is not one of bf16, fp16, off"),
    ],
)
def test_config_errors_exit_2(cli, project, body, args, message):
    write_pyproject(project, body)
    run = cli("config", "train.py", *args)
    assert run.exit_code == 2
    assert message in run.stderr
