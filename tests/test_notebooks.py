"""Jupyter notebooks: `lint` reads their code cells, `convert` rewrites them in place, and
everything that is not a changed cell's source stays byte-identical."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autoaccel.discovery import discover
from autoaccel.notebook import Notebook, NotebookError
from running import run_with_losses

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "notebooks" / "train.ipynb"
DATALOADER_CELL = 6  # `loader = DataLoader(dataset, batch_size=32, shuffle=True)` is its line 5
TRAINING_CELL = 9


def notebook_text(*sources: str | list[str], kernel_language: str = "python") -> str:
    """An nbformat-4 notebook in nbformat's own layout, a markdown cell first."""
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# Title"]}] + [
        {
            "cell_type": "code",
            "execution_count": None,
            "metadata": {},
            "outputs": [],
            "source": source if isinstance(source, list) else source.splitlines(keepends=True),
        }
        for source in sources
    ]
    metadata = {"kernelspec": {"language": kernel_language, "name": "k"}}
    document = {"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


@pytest.fixture
def notebook(tmp_path) -> Path:
    path = tmp_path / "train.ipynb"
    shutil.copy(FIXTURE, path)
    return path


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


# -- reading --------------------------------------------------------------------------------
def test_ipython_lines_become_placeholders_and_cell_magics_are_left_out():
    text = notebook_text(
        "%matplotlib inline\nimport torch\n!pip list\nfiles = !ls\nfor i in range(2):\n    %time f(i)\n",
        "%%bash\necho hi\n",
        'doc = """\n!not a shell escape\n"""\nmessage = (\n    "%d steps"\n    % steps\n)\ntorch.zeros?\n',
    )
    python = Notebook(text).python
    assert python.splitlines() == [
        "# %% autoaccel cell 2",
        "pass  # autoaccel ipython line 0",
        "import torch",
        "pass  # autoaccel ipython line 1",
        "pass  # autoaccel ipython line 2",
        "for i in range(2):",
        "    pass  # autoaccel ipython line 3",
        "# %% autoaccel cell 4",  # cell 3 (%%bash) is not Python
        'doc = """',
        "!not a shell escape",
        '"""',
        "message = (",
        '    "%d steps"',
        "    % steps",  # black's layout of a long `%` format: Python, not a magic
        ")",
        "pass  # autoaccel ipython line 4",
    ]
    compile(python, "<notebook>", "exec")


def test_ipython_lines_continued_with_a_backslash_are_masked_whole():
    # IPython joins the lines after a trailing `\` into the command (`!`, `%`, `x = !`).
    cell = (
        "import torch\n!pip install foo \\\n  bar \\\n    baz\nfor i in range(2):\n"
        "    %run train.py \\\n--epochs 1\n    files = !ls \\\n      -a\n"
        "total = 1 + \\\n    2\n"
    )
    notebook = Notebook(notebook_text(cell, "%%bash\npip install foo \\\n  bar\n"))
    assert notebook.python.splitlines() == [
        "# %% autoaccel cell 2",
        "import torch",
        "pass  # autoaccel ipython line 0",
        "pass  # autoaccel ipython line 1",
        "pass  # autoaccel ipython line 2",
        "for i in range(2):",
        "    pass  # autoaccel ipython line 3",
        "    pass  # autoaccel ipython line 4",  # at the command's indentation, not its own
        "    pass  # autoaccel ipython line 5",
        "    pass  # autoaccel ipython line 6",
        "total = 1 + \\",  # a Python continuation stays Python
        "    2",
    ]  # cell 3 (%%bash) is left out whole
    compile(notebook.python, "<notebook>", "exec")
    assert notebook.render(notebook.python) == "# %% [cell 2]\n" + cell


def test_a_rewrite_keeps_a_continued_ipython_line_whole():
    text = notebook_text("!pip install foo \\\n    bar\nx = 1\n")
    notebook = Notebook(text)
    rewritten = notebook.with_python(notebook.python.replace("x = 1", "x = 2"))
    assert json.loads(rewritten)["cells"][1]["source"] == [
        "!pip install foo \\\n",
        "    bar\n",
        "x = 2\n",
    ]
    # A block indented around it keeps the continuation's own indentation with it.
    indented = notebook.python.replace("pass  #", "if True:\n    pass  #", 1).replace(
        "\npass  #", "\n    pass  #"
    )
    assert "    !pip install foo \\\n        bar\n" in notebook.render(indented)
    with pytest.raises(NotebookError, match="continued"):
        notebook.with_python(notebook.python.replace("line 0\n", "line 0\nimport os\n"))


def test_a_notebook_of_another_language_has_no_python():
    assert Notebook(notebook_text("library(torch)\n", kernel_language="R")).python == ""


def test_a_file_that_is_not_a_notebook_is_an_error():
    for text in ("{", "[]", '{"worksheets": []}'):
        with pytest.raises(NotebookError):
            Notebook(text)


def test_positions_map_to_cells_and_into_the_ipynb_text():
    notebook = Notebook(FIXTURE.read_text())
    line = (
        notebook.python.splitlines().index(
            "loader = DataLoader(dataset, batch_size=32, shuffle=True)"
        )
        + 1
    )
    assert str(notebook.cell_range(line, 10, line, 58)) == f"cell {DATALOADER_CELL}:5:10"
    file_line, file_column = notebook.file_position(line, 10)
    raw = FIXTURE.read_text().splitlines()[file_line - 1]
    assert raw[file_column - 1 :].startswith("DataLoader(dataset")


def test_a_source_written_as_one_string_maps_and_rewrites():
    text = notebook_text("import torch\nx = torch.zeros(2)\n").replace(
        '"source": [\n    "import torch\\n",\n    "x = torch.zeros(2)\\n"\n   ]',
        '"source": "import torch\\nx = \\"a\\" + torch.zeros(2)\\n"',
    )
    notebook = Notebook(text)
    assert notebook.python.splitlines()[2] == 'x = "a" + torch.zeros(2)'
    file_line, file_column = notebook.file_position(3, 11)
    assert text.splitlines()[file_line - 1][file_column - 1 :].startswith("torch.zeros(2)")
    rewritten = notebook.with_python(notebook.python.replace("zeros", "ones"))
    assert json.loads(rewritten)["cells"][1]["source"] == 'import torch\nx = "a" + torch.ones(2)\n'


def test_a_rewrite_that_moves_a_cell_boundary_is_refused():
    notebook = Notebook(FIXTURE.read_text())
    with pytest.raises(NotebookError, match="cell boundary"):
        notebook.with_python(notebook.python.replace("# %% autoaccel cell 6\n", ""))
    with pytest.raises(NotebookError, match="IPython line"):
        notebook.with_python(notebook.python.replace("pass  # autoaccel ipython line 0\n", ""))


# -- lint -------------------------------------------------------------------------------------
def test_lint_reports_cell_and_line(cli, notebook):
    run = cli("lint", "--select", "ACC101,ACC103", "train.ipynb")
    assert run.exit_code == 1
    assert run.stdout.splitlines() == [
        f"train.ipynb:cell {DATALOADER_CELL}:5:10: ACC101 `DataLoader` loads batches"
        " in the main process (`num_workers=0`)",
        f"train.ipynb:cell {TRAINING_CELL}:4:16: ACC103 Batch is copied to the GPU"
        " synchronously (no `non_blocking=True`)",
        f"train.ipynb:cell {TRAINING_CELL}:4:30: ACC103 Batch is copied to the GPU"
        " synchronously (no `non_blocking=True`)",
    ]


def test_lint_json_rows_are_cell_lines(cli, notebook):
    (record,) = json.loads(
        cli("lint", "--select", "ACC101", "--format", "json", "train.ipynb").stdout
    )
    assert (record["cell"], record["location"], record["end_location"]) == (
        DATALOADER_CELL,
        {"row": 5, "column": 10},
        {"row": 5, "column": 58},
    )


def test_lint_github_annotation_is_on_the_ipynb_line(cli, notebook):
    run = cli("lint", "--select", "ACC101", "--format", "github", "train.ipynb")
    raw_line = (
        notebook.read_text()
        .splitlines()
        .index('    "loader = DataLoader(dataset, batch_size=32, shuffle=True)"')
        + 1
    )
    assert run.stdout.startswith(
        f"::error title=autoaccel (ACC101),file=train.ipynb,line={raw_line},col=15,"
    )
    assert run.stdout.rstrip().endswith(f"(cell {DATALOADER_CELL}:5:10)")


def test_noqa_in_a_cell_is_honoured(cli, tmp_path):
    (tmp_path / "nb.ipynb").write_text(
        notebook_text(
            "from torch.utils.data import DataLoader\n", "DataLoader(ds)  # noqa: ACC101\n"
        )
    )
    assert cli("lint", "--select", "ACC101", "nb.ipynb").exit_code == 0


def test_syntax_error_is_located_in_its_cell(cli, tmp_path):
    (tmp_path / "nb.ipynb").write_text(notebook_text("import torch\n", "x = (1,\n"))
    run = cli("lint", "nb.ipynb")
    assert run.exit_code == 2
    assert run.stderr.startswith("nb.ipynb:cell 3:1:")


def test_lint_after_a_continued_shell_line_reports_the_right_line(cli, tmp_path):
    (tmp_path / "nb.ipynb").write_text(
        notebook_text(
            "!pip install torch \\\n    torchvision\n",
            "%pip install foo \\\n  bar\nfrom torch.utils.data import DataLoader\n"
            "loader = DataLoader(ds)\nfor x in loader:\n    model(x).sum().backward()\n",
            "%%bash\npip install foo \\\n  bar\n",
        )
    )
    run = cli("lint", "--select", "ACC101", "nb.ipynb")
    assert (run.exit_code, run.stderr.count("SyntaxError")) == (1, 0), run.stderr
    assert run.stdout.startswith("nb.ipynb:cell 3:4:10: ACC101 `DataLoader`")


def test_directories_include_notebooks_but_not_checkpoints(tmp_path):
    (tmp_path / "a.ipynb").write_text(notebook_text("import torch\n"))
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "a-checkpoint.ipynb").write_text(notebook_text("x\n"))
    (tmp_path / "b.py").write_text("import torch\n")
    assert discover([str(tmp_path)]) == [tmp_path / "a.ipynb", tmp_path / "b.py"]


def test_fix_rewrites_only_the_fixed_cell(cli, notebook):
    before = notebook.read_text()
    run = cli("lint", "--select", "ACC102", "--fix", "train.ipynb")
    assert run.exit_code == 0, run.stderr
    after = notebook.read_text()
    old, new = cells(FIXTURE), cells(notebook)
    changed = [i + 1 for i, (a, b) in enumerate(zip(old, new)) if a != b]
    assert changed == [DATALOADER_CELL]
    assert {k: v for k, v in new[DATALOADER_CELL - 1].items() if k != "source"} == {
        k: v for k, v in old[DATALOADER_CELL - 1].items() if k != "source"
    }
    assert "pin_memory=torch.cuda.is_available()" in source(new[DATALOADER_CELL - 1])
    # Byte-identical outside the cell's source: same prefix and suffix text.
    start = before.index('"loader = DataLoader')
    assert after[:start] == before[:start]
    assert after.endswith(before[before.index('"loader = DataLoader') + 60 :])


def test_diff_shows_cells_with_their_magics(cli, notebook):
    run = cli("lint", "--select", "ACC101", "--unsafe-fixes", "--diff", "train.ipynb")
    assert run.exit_code == 1
    assert run.stdout.startswith("--- train.ipynb\n+++ train.ipynb\n")
    assert "+import os\n %load_ext autoreload\n" in run.stdout
    assert "autoaccel ipython line" not in run.stdout
    assert notebook.read_text() == FIXTURE.read_text()


# -- convert ----------------------------------------------------------------------------------
def test_convert_preview_reads_like_the_notebook_and_writes_nothing(cli, notebook, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    run = cli("convert", "train.ipynb", "--amp", "off")
    assert run.exit_code == 0, run.stderr
    diff = run.stdout.split("\ntrain.ipynb: ")[0]
    assert " # %% [cell 2]\n+import os\n %load_ext autoreload\n" in diff  # magics as written
    assert " # %% [cell 7]\n" in diff  # cell headers as context
    assert (
        "+        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)" in diff
    )
    assert "autoaccel cell" not in diff and "autoaccel ipython" not in diff
    assert notebook.read_text() == FIXTURE.read_text()


def test_convert_write_keeps_cells_outputs_and_metadata(cli, notebook):
    assert cli("convert", "train.ipynb", "--write").exit_code == 0
    old, new = json.loads(FIXTURE.read_text()), json.loads(notebook.read_text())
    assert new["metadata"] == old["metadata"]
    assert len(new["cells"]) == len(old["cells"])
    for before, after in zip(old["cells"], new["cells"]):
        assert {k: v for k, v in before.items() if k != "source"} == {
            k: v for k, v in after.items() if k != "source"
        }  # outputs, execution counts, cell metadata
    changed = [i + 1 for i, (a, b) in enumerate(zip(old["cells"], new["cells"])) if a != b]
    assert changed == [2, DATALOADER_CELL, TRAINING_CELL]  # `import os`, loader, training step
    assert source(new["cells"][1]).startswith("import os\n%load_ext autoreload\n%autoreload 2\n")
    assert source(new["cells"][2]).startswith("!nvidia-smi -L\n")
    assert source(new["cells"][7]) == source(old["cells"][7])  # the %%bash cell
    assert "with torch.autocast(" in source(new["cells"][TRAINING_CELL - 1])
    # Idempotent: converting the result again changes nothing.
    assert cli("convert", "train.ipynb", "--check").exit_code == 0


def test_convert_to_ddp_is_refused_for_notebooks(cli, notebook):
    run = cli("convert", "train.ipynb", "--to", "ddp")
    assert run.exit_code == 2
    assert "--to single" in run.stderr
    assert notebook.read_text() == FIXTURE.read_text()


@pytest.mark.runs
def test_converted_notebook_trains_the_same(cli, notebook, tmp_path):
    """The code cells, converted with `--amp off`, give the original's losses: every step
    of epoch 1 (the shuffled loader's RNG draws shift after it, see test_convert_runs)
    and the last epoch's mean within 3 %."""
    pytest.importorskip("torch")
    original = tmp_path / "original.py"
    original.write_text(Notebook(notebook.read_text()).python)
    assert cli("convert", "train.ipynb", "--amp", "off", "--write").exit_code == 0
    converted = tmp_path / "converted.py"
    converted.write_text(Notebook(notebook.read_text()).python)
    runs = []
    for script in (original, converted):
        cwd = tmp_path / script.stem
        cwd.mkdir()
        runs.append(run_with_losses(script, [], cwd))
    steps = 512 // 32
    assert len(runs[0]) == len(runs[1]) == 2 * steps
    assert runs[1][:steps] == pytest.approx(runs[0][:steps], rel=1e-5)
    last = [sum(losses[steps:]) / steps for losses in runs]
    assert last[1] == pytest.approx(last[0], rel=0.03)
