"""Convert a script together with the modules of its project where its training code lives.

`convert train.py` follows the script's imports to modules of its project
(`autoaccel.analysis.project`): the training loop in `trainer.py`, the DataLoader in
`data.py`. Each change goes where the code is; the process-group set-up stays in the
script, and an imported module that gets DDP changes reads `RANK`, `LOCAL_RANK` and
`WORLD_SIZE` from torchrun's environment itself, so it still imports and runs alone.

Steps run one at a time over every file (a step sees what earlier steps did to all
files: `set_epoch` in `trainer.py` sees the sampler given to the loader in `data.py`),
each with the whole program analysed. The result is checked as a single file is: every
file parses and compiles, and converting the converted files again changes none.
Modules outside the project (libraries) are never read, let alone rewritten.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.program import Program, SourceModule
from autoaccel.analysis.project import SCRIPT, load_project
from autoaccel.analysis.script_model import ProjectContext
from autoaccel.analysis.training import LoopRole, find_training
from autoaccel.convert.log import ConversionLog, ConvertOptions
from autoaccel.convert.pipeline import (
    Conversion,
    ConversionError,
    ModuleState,
    apply_step,
    check_result,
    fewer_collections,
    transforms_for,
)
from autoaccel.convert.transforms.data_parallel import settle_project_refusals
from autoaccel.convert.transforms.distributed._base import converted_modules
from autoaccel.fileio import SourceFile, read_source
from autoaccel.source import parse

if TYPE_CHECKING:
    from autoaccel.facts.resolve import ConversionFacts


@dataclass(frozen=True)
class ProjectFile:
    """A module of the project that a conversion may rewrite."""

    name: str  # as imported (`toygpt.trainer`); the script is `__main__`
    path: Path
    package: str
    source: SourceFile


@dataclass
class Project:
    """The files a conversion rewrites (the script first) and the other modules of the
    project, which the analysis reads as they are."""

    files: list[ProjectFile]
    context: list[SourceModule] = field(default_factory=list)
    # Every file the script's project imports (parent packages' `__init__.py` included):
    # what `-o DIR` copies so that the result runs from DIR.
    all_paths: list[Path] = field(default_factory=list)

    @property
    def script(self) -> ProjectFile:
        return self.files[0]


@dataclass
class FileConversion:
    file: ProjectFile
    conversion: Conversion


@dataclass
class ProjectConversion:
    files: list[FileConversion]  # the script first

    @property
    def changed(self) -> list[FileConversion]:
        return [f for f in self.files if f.conversion.changed]


def find_project(script: Path, source: SourceFile) -> Project | None:
    """`script` with the modules of its project it imports: those that hold training
    code (a training step loop, or a DataLoader that one reads) are converted with it,
    the others are read as they are (a model class defined there is a model). None when
    it imports none (a one-file conversion). Raises `SourceError` when the script does
    not parse, `ConversionError` when nothing trains and a module of the project could
    not be read."""
    tree = parse(source.text)
    loaded = load_project(script, tree)
    if not loaded.modules:
        return None
    program = Program.of(loaded.all_modules, loaded.resolve)
    training = find_training(program)
    # (a module that only evaluates, or only builds loaders nothing trains on, keeps its code)
    steps = [loop for loop in training.step_loops.values() if loop.role is LoopRole.TRAIN]
    holding = converted_modules(program, training)
    if loaded.unreadable and not steps:
        name, why = next(iter(loaded.unreadable.items()))
        raise ConversionError(
            f"error: module `{name}` of the project {why}; the training loop this script"
            " runs may be there, so nothing is converted"
        )
    rewritten = [m for m in loaded.modules.values() if m in holding and m.path is not None]
    files = [ProjectFile(SCRIPT, script, "", source)]
    for module in rewritten:
        path = _beside(script, Path(module.path))  # type: ignore[arg-type]
        files.append(ProjectFile(module.name, path, module.package, read_source(path)))
    context = [m for m in loaded.modules.values() if m not in rewritten]
    paths = [script, *(_beside(script, Path(m.path)) for m in loaded.modules.values() if m.path)]
    return Project(files, context, _with_packages(paths, loaded.roots))


def _beside(script: Path, path: Path) -> Path:
    """`path` spelled from where `script` is spelled (`fixtures/packaged/toygpt/data.py`
    for `fixtures/packaged/train.py`), as messages and diffs name it."""
    folder, path = script.resolve().parent, path.resolve()
    if path.is_relative_to(folder):
        return script.parent / path.relative_to(folder)
    return path if script.is_absolute() else Path(os.path.relpath(path))


def _with_packages(paths: list[Path], roots: list[Path]) -> list[Path]:
    """`paths` and the `__init__.py` of every package folder between them and a root."""
    found = {path.resolve(): path for path in paths}
    tops = {root.resolve() for root in roots}
    for path in paths[1:]:
        folder = path.resolve().parent
        while folder not in tops and folder != folder.parent:
            init = folder / "__init__.py"
            if init.is_file():
                found.setdefault(init, init)
            folder = folder.parent
    return list(found.values())


def convert_project(
    project: Project,
    options: ConvertOptions,
    script_name: str,
    facts: ConversionFacts | None = None,
) -> ProjectConversion:
    """Convert every file of `project` (`script_name` names the converted script in
    launch commands), with the `facts` of a run of the script where there was one (the
    second conversion, of the result, gets them too, as for one file). Raises
    `ConversionError` (its `path` set) when a result fails a safety check; nothing may
    then be written."""
    logs = [ConversionLog() for _ in project.files]
    texts = [f.source.text for f in project.files]
    histories: list[list[tuple[str, str]]] = [[] for _ in texts]  # each file's changes
    with fewer_collections():
        converted = _run(project, texts, options, logs, script_name, facts, histories)
        if options.target == "dp":
            settle_project_refusals(logs, _training_files(project, facts))
        changed = {i for i, (before, after) in enumerate(zip(texts, converted)) if before != after}
        again = converted
        if changed:  # Black's stability check: converting the result again changes no file
            again_logs = [ConversionLog() for _ in texts]
            again = _run(
                project, converted, options, again_logs, script_name, facts, [*map(list, histories)]
            )
    for index, file in enumerate(project.files):
        if index in changed or again[index] != converted[index]:
            try:
                check_result(converted[index], str(file.path), lambda _, i=index: again[i])
            except ConversionError as error:
                error.path = file.path
                raise
    return ProjectConversion(
        [
            FileConversion(file, Conversion(text, result, log))
            for file, text, result, log in zip(project.files, texts, converted, logs)
        ]
    )


def _training_files(project: Project, facts: ConversionFacts | None) -> set[int] | None:
    """The indexes of the files whose `backward()` calls the run of the script ran; None
    without a run, or where they ran in none (a library's training loop)."""
    if facts is None:
        return None
    ran = {c.site.path for c in facts.facts.calls if c.kind == "backward"}
    files = {i for i, f in enumerate(project.files) if os.path.realpath(f.path) in ran}
    return files or None


def _run(
    project: Project,
    texts: list[str],
    options: ConvertOptions,
    logs: list[ConversionLog],
    script_name: str,
    facts: ConversionFacts | None = None,
    histories: list[list[tuple[str, str]]] | None = None,
) -> list[str]:
    """Each step of the target over every file in turn, each file analysed with the
    others as they are at that moment. The steps get `facts` (they map a tree's lines
    back through its file's `histories` entry, extended in place)."""
    states = [ModuleState.of(text) for text in texts]
    for state, history in zip(states, histories or []):
        state.history = history
    if facts is not None:
        facts.history = states[0].history
        for file, state in zip(project.files[1:], states[1:]):
            facts.track(file.path, file.source.text, state.history)
    modules: dict[int, SourceModule] = {}  # id(tree) -> the file as the analysis reads it

    def as_module(file: ProjectFile, state: ModuleState) -> SourceModule:
        key = id(state.tree)
        if key not in modules:
            index = ModuleIndex(state.tree)
            modules[key] = SourceModule(file.name, state.tree, index, str(file.path), file.package)
        return modules[key]

    for step in transforms_for(options):
        if not step.enabled(options):
            continue
        for index, (file, state) in enumerate(zip(project.files, states)):
            others = [
                as_module(other, other_state)
                for other, other_state in zip(project.files, states)
                if other is not file
            ]
            entry = index == 0
            name = script_name if entry else str(file.path)
            here = ProjectContext(
                file.name, file.package, str(file.path), (*others, *project.context)
            )
            context = state.context(options, logs[index], name, facts, here, entry)
            apply_step(step, state, context)
    return [state.text for state in states]
