"""`finish` plans the end of a conversion as data (writing nothing); `apply` carries it out."""

from pathlib import Path

import pytest

from autoaccel.convert.finish import (
    EXIT_CHANGED,
    EXIT_ERROR,
    EXIT_OK,
    FileWrite,
    FinishRequest,
    Module,
    WritePlan,
    apply,
    finish,
    link_the_rest,
    notebook_module,
)
from autoaccel.convert.log import ConversionLog, Skipped
from autoaccel.convert.pipeline import Conversion
from autoaccel.convert.project_conversion import Project, ProjectFile
from autoaccel.fileio import SourceFile
from autoaccel.notebook import Notebook

BEFORE, AFTER = "x = 1\n", "x = 2\n"


def module(path: Path, after: str = AFTER, **log) -> Module:
    path.write_text(BEFORE)
    source = SourceFile(BEFORE, "utf-8", BEFORE.encode())
    return Module(path, source, Conversion(BEFORE, after, ConversionLog(**log)), after)


def project_of(*modules: Module) -> Project:
    files = [ProjectFile(f"m{i}", m.path, "", m.source) for i, m in enumerate(modules)]
    return Project(files, all_paths=[m.path for m in modules])


def test_a_write_in_place_is_planned_not_done(tmp_path):
    script = module(tmp_path / "train.py")
    plan = finish([script], FinishRequest("single", write=True))
    assert plan.writes == [FileWrite(script.path, AFTER, "utf-8", BEFORE.encode())]
    assert (plan.exit_code, plan.decided, plan.report.writing) == (EXIT_OK, False, True)
    assert script.path.read_text() == BEFORE


def test_check_exits_1_when_something_changes(tmp_path):
    plan = finish([module(tmp_path / "train.py")], FinishRequest("single", check=True))
    assert (plan.writes, plan.exit_code) == ([], EXIT_CHANGED)


def test_a_refusal_plans_no_write_and_says_why(tmp_path):
    wrong = Skipped("DDP wrap", 3, "no trained model", wrong=True)
    script = module(tmp_path / "train.py", skipped=[wrong])
    plan = finish([script], FinishRequest("ddp", write=True))
    assert (plan.writes, plan.exit_code, plan.decided) == ([], EXIT_CHANGED, True)
    assert plan.messages == [
        f"{script.path}:3:1: error: DDP wrap not applied: no trained model",
        f"{script.path}: error: --to ddp refused: the result would not train like the original"
        " (see above); nothing written. `--allow-partial` writes it anyway.",
    ]


def test_output_file_refuses_a_conversion_that_changes_a_module_too(tmp_path):
    modules = [module(tmp_path / "train.py"), module(tmp_path / "data.py")]
    plan = finish(modules, FinishRequest("ddp", output=tmp_path / "out.py"), project_of(*modules))
    assert (plan.report, plan.writes, plan.exit_code) == (None, [], EXIT_ERROR)
    assert "the conversion changes 2 files" in plan.messages[0]


def test_output_folder_plans_a_copy_of_the_project(tmp_path):
    (tmp_path / "src").mkdir()
    modules = [module(tmp_path / "src" / "train.py"), module(tmp_path / "src" / "data.py", BEFORE)]
    out = tmp_path / "out"
    plan = finish(modules, FinishRequest("ddp", output=out), project_of(*modules))
    assert [(w.path, w.text) for w in plan.writes] == [
        (out / "train.py", AFTER),
        (out / "data.py", BEFORE),
    ]
    assert plan.folders == [out] and not out.exists()


@pytest.mark.parametrize("force", [False, True])
def test_a_launcher_with_other_contents_stops_every_write_unless_forced(tmp_path, force):
    (tmp_path / "train.sbatch").write_text("mine\n")
    script = module(tmp_path / "train.py", extra_files={"train.sbatch": "new\n"})
    plan = finish([script], FinishRequest("ddp", write=True, force=force))
    written = [w.path.name for w in plan.writes]
    assert written == (["train.py", "train.sbatch"] if force else [])
    assert plan.exit_code == (EXIT_OK if force else EXIT_ERROR)


def test_apply_writes_every_file_or_none(tmp_path, capsys):
    kept = tmp_path / "kept.py"
    plan = WritePlan(
        None, writes=[FileWrite(kept, AFTER), FileWrite(tmp_path / "missing" / "x.py", AFTER)]
    )
    assert apply(plan) == EXIT_ERROR
    assert "x.py: error: nothing written: no such folder" in capsys.readouterr().err
    assert not kept.exists()


def test_apply_makes_the_folders_of_a_copy(tmp_path):
    target = tmp_path / "out" / "pkg" / "x.py"
    assert apply(WritePlan(None, writes=[FileWrite(target, AFTER)], folders=[target.parent])) == 0
    assert target.read_text() == AFTER


def test_a_notebook_is_reported_as_cells_and_written_as_a_notebook(tmp_path):
    notebook = Notebook(
        '{"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "source": ["x = 1\\n"]}],'
        ' "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
    )
    converted = notebook.python.replace("x = 1", "x = 2")
    found = notebook_module(tmp_path / "a.ipynb", notebook, Conversion(notebook.python, converted))
    assert "# %% [cell 1]" in found.conversion.converted
    assert '"source": ["x = 2\\n"]' in found.text


def test_the_proof_s_copy_of_a_project_links_the_files_it_does_not_copy(tmp_path):
    """pointnet's dataset module read `../misc/num_seg_classes.txt` next to itself: in the
    proof's copy of the project (its Python files only) it was missing and the proof
    failed. The copy links every entry the copy lacks, in each folder both have."""
    project, copy = tmp_path / "project", tmp_path / "copy"
    (project / "pkg").mkdir(parents=True)
    (project / "meta").mkdir()
    (project / "meta" / "classes.txt").write_text("4\n")
    (project / "pkg" / "data.py").write_text("# the original\n")
    (project / "pkg" / "vocab.json").write_text("{}\n")
    (project / "pkg" / "__pycache__").mkdir()
    (copy / "pkg").mkdir(parents=True)
    (copy / "pkg" / "data.py").write_text("# converted\n")
    link_the_rest(project, copy)
    assert (copy / "meta").is_symlink() and (copy / "meta" / "classes.txt").read_text() == "4\n"
    assert (copy / "pkg" / "vocab.json").is_symlink()
    assert (copy / "pkg" / "data.py").read_text() == "# converted\n"  # the copy's own file stays
    assert not (copy / "pkg" / "__pycache__").exists()
    link_the_rest(project, copy)  # again: nothing more to link
