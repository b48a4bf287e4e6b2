"""Names the conversion inserts, kept apart from the script's own.

Every `--to ddp|fsdp|dp` step writes its code with the names of `INSERTED` (`dist`,
`RANK`, `NoWriter`, `import warnings`, ...). Where the script uses one of them already
(bound in any scope, by a loop, `except` or `with` target, a `del`, a `def` or `class`, an
import of something else, or read from a star import), `ChooseNames` first gives the
script's own a placeholder (`dist_`), so the steps see only their own; after the last
step `RestoreNames` gives the conversion's code a free name (`torch_dist`, `RANK2`) and
the script its names back. A comment above the conversion's code lists the renames: a
second conversion of the result reads it to find its own code.

A star import from a module whose names cannot be read (not a file next to the script)
is refused when it comes after the leading imports: it could rebind any inserted name
while the script runs. In the leading imports, the conversion's definitions come after
it, so only the names the script reads from it matter, and those count as used.
"""

from __future__ import annotations

import itertools
from collections import deque
import re
import textwrap
from pathlib import Path

import libcst as cst

from autoaccel.convert.transform import Transform
from autoaccel.convert.log import ConvertOptions
from autoaccel.cst_edit import is_docstring, leading_import_block

_FSDP = "torch.distributed.fsdp."
_STATE_DICT = "torch.distributed.checkpoint.state_dict."

# Every name a step inserts, with what it must name when the script has it too: the
# import targets that bind it as the conversion does (none: a definition of the steps).
INSERTED: dict[str, frozenset[str]] = {
    **dict.fromkeys(
        (
            "DISTRIBUTED", "RANK", "LOCAL_RANK", "WORLD_SIZE", "backend",
            "LOCAL_WORLD_SIZE", "CPUS_PER_PROCESS", "per_process_batch_size",
            "sync_gradients", "no_sync", "on_any_rank", "every_process", "first_process_decides", "all_reduce_sums",
            "average_over_processes", "sum_over_processes", "NoWriter", "ShardedDraws", "ShardedStream", "shard_rows",
            "shard_model", "full_state_dict", "load_full_state_dict",
            "full_optimizer_state_dict", "load_full_optimizer_state_dict", "ModelWithLoss",
            "LossInForward", "MethodAsForward", "register_fsdp_forward_method",
            "full_state_dict_everywhere", "ShardedBatches", "summed_over_processes", "unwrapped",
            "with_rank_zero_log_dir", "averaged_over_processes", "endless_epochs", "whole",
        ),
        frozenset(),
    ),
    **{module: frozenset({module}) for module in ("os", "gc", "warnings", "contextlib")},
    "dist": frozenset({"torch.distributed"}),
    # apex's too: `MigrateLaunch` replaces its import by torch's, or the conversion refuses
    "DDP": frozenset(
        {
            "torch.nn.parallel.DistributedDataParallel",
            "torch.nn.parallel.distributed.DistributedDataParallel",
            "apex.parallel.DistributedDataParallel",
        }
    ),
    "DistributedSampler": frozenset(
        {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}
    ),
    "default_hooks": frozenset({"torch.distributed.algorithms.ddp_comm_hooks.default_hooks"}),
    **{name: frozenset({_FSDP + name}) for name in ("fully_shard", "MixedPrecisionPolicy", "CPUOffloadPolicy", "FSDPModule", "register_fsdp_forward_method")},
    **{
        name: frozenset({_STATE_DICT + name})
        for name in (
            "StateDictOptions", "get_model_state_dict", "set_model_state_dict",
            "get_optimizer_state_dict", "set_optimizer_state_dict",
        )
    },
}  # fmt: skip
# A free name to try before `name2`, `name3`, ...
_PREFERRED = {"dist": "torch_dist"}

RENAMED_COMMENT = "# Renamed, the script has these names already:"
_RENAME = re.compile(r"(\w+) -> (\w+)")
# The first line of the set-up block, and the docstring of `--to dp`'s wrapper class.
_SETUP_START = re.compile(r'^\w+ = "LOCAL_RANK" in os\.environ$')
WRAPPER_DOC = '"""A model and its loss in one `forward`'


class ChooseNames(Transform):
    DESCRIPTION = "Give the script's own uses of names the conversion inserts a placeholder."
    renames_names = True

    @classmethod
    def enabled(cls, options: ConvertOptions) -> bool:
        return options.target in ("dp", "ddp", "fsdp")

    def transform_module(self, tree: cst.Module) -> cst.Module:
        names = self.inserted_names
        uses = _Uses.of(tree)
        chosen = renames_listed(tree) if is_converted(tree) else None
        if chosen is None:
            if name_refusal(tree, self.context.filename) is not None:
                return tree  # the first step of the target refuses the script
            star_names = _star_imported_names(uses.star_imports, self.context.filename)
            taken = sorted(name for name in INSERTED if uses.clashes(name, star_names))
            used = uses.names | star_names | INSERTED.keys()
            chosen = {}
            for name in taken:
                chosen[name] = fresh_name(_PREFERRED.get(name, name), used)
                used.add(chosen[name])
        else:
            used = set(uses.names)
        names.chosen = chosen
        names.placeholders = {}
        for name in chosen:
            names.placeholders[name] = fresh_name(f"{name}_", used)
            used.add(names.placeholders[name])
        if not chosen:
            return tree
        # on a converted script the conversion's renamed code gets its canonical names back
        mapping = {**names.placeholders, **{new: name for name, new in chosen.items()}}
        return tree.visit(_Rename(mapping))


class RestoreNames(Transform):
    DESCRIPTION = "Give the script its own names back, and the conversion's code free ones."
    renames_names = True

    @classmethod
    def enabled(cls, options: ConvertOptions) -> bool:
        return options.target in ("dp", "ddp", "fsdp")

    def transform_module(self, tree: cst.Module) -> cst.Module:
        names = self.inserted_names
        if not names.chosen:
            return tree
        mapping = {**names.chosen, **{own: name for name, own in names.placeholders.items()}}
        renamed = tree.visit(_Rename(mapping))
        if renames_listed(tree):
            return renamed  # a converted script's: listed already
        in_code = {name.value for name in _names_in(tree)}  # the conversion's, by now
        listed = {name: new for name, new in names.chosen.items() if name in in_code}
        return _with_renames_comment(renamed, listed) if listed else renamed


def is_converted(tree: cst.Module) -> bool:
    """Whether `tree` holds a conversion's own code (whatever its names)."""
    return any(_is_conversion_code(statement) for statement in tree.body)


def _is_conversion_code(statement: cst.BaseStatement) -> bool:
    """Whether `statement` starts the set-up block of `--to ddp` / `fsdp`, or is the
    wrapper class of `--to dp`: found by their shape."""
    if isinstance(statement, cst.SimpleStatementLine):
        return len(statement.body) == 1 and bool(_SETUP_START.match(_dotted(statement.body[0])))
    if (
        isinstance(statement, cst.ClassDef)
        and statement.body.body
        and is_docstring(statement.body.body[0])
    ):
        docstring = statement.body.body[0].body[0].value  # type: ignore[attr-defined]
        return isinstance(docstring, cst.SimpleString) and docstring.value.startswith(WRAPPER_DOC)
    return False


def renames_listed(tree: cst.Module) -> dict[str, str]:
    """The renames the comment of a converted module lists (canonical -> its name)."""
    for statement in tree.body:
        comments = [
            line.comment.value for line in statement.leading_lines if line.comment is not None
        ]
        if RENAMED_COMMENT in comments:
            listed = itertools.takewhile(
                lambda comment: comment.startswith("#   "),
                comments[comments.index(RENAMED_COMMENT) + 1 :],
            )
            return dict(_RENAME.findall(" ".join(listed)))
    return {}


def name_refusal(tree: cst.Module, path: str | None) -> tuple[str, cst.CSTNode] | None:
    """Why the conversion's names cannot be kept apart from the script's, with where: a
    star import of unknown names after the leading imports (it could rebind any inserted
    name), or an inserted name the script binds by `import a.b` beside another use (the
    import cannot bind a placeholder)."""
    _, end = leading_import_block(tree)
    leading = {
        small for s in tree.body[:end] if isinstance(s, cst.SimpleStatementLine) for small in s.body
    }
    uses = _Uses.of(tree)
    for star in uses.star_imports:
        if star not in leading and _module_file(star, path) is None:
            return (
                "`import *` from a module whose names cannot be read, after the leading"
                " imports: it could replace the names the converted script defines; import"
                " the names it needs by name, then convert",
                star,
            )
    for name, statement in uses.dotted_imports.items():
        if name in INSERTED and uses.clashes(name, set()):
            return (
                f"the script binds `{name}` with a dotted import and uses the name otherwise"
                f" too, while the converted script needs its own `{name}`; write"
                f" `import {name}` on its own line, then convert",
                statement,
            )
    return None


def variable_names(tree: cst.Module) -> set[str]:
    """The names `tree` binds or reads as variables anywhere (not attribute names or
    keywords): what a name the conversion adds must differ from."""
    uses = _Uses.of(tree)
    return uses.stores | uses.reads | uses.imports.keys()


class _Uses(cst.CSTVisitor):
    """How a module uses each name: stores (assignment, loop, `except` or `with` target,
    `del`, `def`, `class`, parameter, `global`), imports (and what they bind), reads."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()
        self.stores: set[str] = set()
        self.reads: set[str] = set()
        self.imports: dict[str, set[str]] = {}  # bound name -> the targets it imports
        self.dotted_imports: dict[str, cst.Import] = {}  # `import a.b` binds `a`
        self.star_imports: list[cst.ImportFrom] = []
        self._not_reads: set[cst.Name] = set()

    @classmethod
    def of(cls, tree: cst.Module) -> _Uses:
        """The uses in `tree`, read once per tree: the steps of a conversion that change
        nothing hand the next one the very same tree (read-only, like the trees)."""
        for known, uses in tuple(_RECENT_USES):  # (a copy: other threads convert too)
            if known is tree:
                return uses
        uses = cls()
        tree.visit(uses)
        _RECENT_USES.appendleft((tree, uses))
        return uses

    def clashes(self, name: str, star_names: set[str]) -> bool:
        """Whether the inserted `name` would clash with the script's use of it."""
        if name in self.stores or name in star_names:
            return True
        imported = self.imports.get(name)
        if imported is None:
            return name in self.reads  # from a star import, or set at run time
        return not imported <= INSERTED[name]

    def _store(self, target: cst.CSTNode | None) -> None:
        if isinstance(target, cst.Name):
            self.stores.add(target.value)
            self._not_reads.add(target)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._store(element.value)
        elif isinstance(target, cst.StarredElement):
            self._store(target.value)

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)
        if node not in self._not_reads:
            self.reads.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._not_reads.add(node.attr)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._not_reads.add(node.keyword)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._store(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._store(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._store(node.target)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._store(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._store(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._store(node.target)

    def visit_Del(self, node: cst.Del) -> None:
        self._store(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._store(node.name)  # `except ... as e`, `with ... as f` (imports: undone below)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._store(node.name)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._store(node.name)

    def visit_Param(self, node: cst.Param) -> None:
        self._store(node.name)

    def visit_Global(self, node: cst.Global) -> None:
        for item in node.names:
            self._store(item.name)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        for item in node.names:
            self._store(item.name)

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            target = _dotted(alias.name)
            bound = alias.asname.name.value if alias.asname is not None else target.split(".")[0]  # type: ignore[union-attr]
            self._import(bound, target if alias.asname is not None else target.split(".")[0])
            if alias.asname is None and "." in target:
                self.dotted_imports.setdefault(bound, node)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if isinstance(node.names, cst.ImportStar):
            self.star_imports.append(node)
            return False
        module = "." * len(node.relative) + (
            _dotted(node.module) if node.module is not None else ""
        )
        for alias in node.names:
            name = _dotted(alias.name)
            bound = alias.asname.name.value if alias.asname is not None else name  # type: ignore[union-attr]
            self._import(bound, f"{module}.{name}")
        return False

    def _import(self, bound: str, target: str) -> None:
        self.names.add(bound)
        self.imports.setdefault(bound, set()).add(target)


# the trees the latest `_Uses.of` calls read (a conversion runs some 30 steps on a few trees)
_RECENT_USES: deque[tuple[cst.Module, _Uses]] = deque(maxlen=4)


class _Rename(cst.CSTTransformer):
    """Every use of a name of `mapping` renamed (attributes, keyword arguments and the
    modules of imports kept); an import of a renamed name gets `as` (`import os as os_`),
    and loses it once the name is the module's again."""

    def __init__(self, mapping: dict[str, str]) -> None:
        super().__init__()
        self.mapping = mapping
        self._kept: set[cst.Name] = set()

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._kept.add(node.attr)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._kept.add(node.keyword)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is not None:
            self._keep(node.module)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        self._keep(node.name)

    def _keep(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.Name):
            self._kept.add(node)
        elif isinstance(node, cst.Attribute):
            self._keep(node.value)
            self._kept.add(node.attr)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        new = self.mapping.get(updated_node.value)
        if new is None or original_node in self._kept:
            return updated_node
        return updated_node.with_changes(value=new)

    def leave_ImportAlias(
        self, original_node: cst.ImportAlias, updated_node: cst.ImportAlias
    ) -> cst.ImportAlias:
        if updated_node.asname is None:
            new = (
                self.mapping.get(updated_node.name.value)
                if isinstance(updated_node.name, cst.Name)
                else None
            )
            return (
                updated_node
                if new is None
                else updated_node.with_changes(asname=cst.AsName(cst.Name(new)))
            )
        asname = updated_node.asname.name
        if isinstance(asname, cst.Name) and asname.value == _dotted(updated_node.name):
            return updated_node.with_changes(asname=None)
        return updated_node


def _with_renames_comment(tree: cst.Module, chosen: dict[str, str]) -> cst.Module:
    """`tree` with the comment listing `chosen` above the conversion's code: the set-up
    block, the wrapper class of `--to dp`, or else the first statement using a new name."""
    new_names = set(chosen.values())
    body = list(tree.body)
    anchors = [i for i, s in enumerate(body) if _is_conversion_code(s)] or [
        i
        for i, s in enumerate(body)
        if not (isinstance(s, cst.SimpleStatementLine) and _is_import(s))
        and any(name.value in new_names for name in _names_in(s))
    ]
    if not anchors:
        return tree
    listed = textwrap.wrap(
        ", ".join(f"{name} -> {new}" for name, new in chosen.items()),
        width=88,
        initial_indent="#   ",
        subsequent_indent="#   ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    lines = [cst.EmptyLine(comment=cst.Comment(text)) for text in (RENAMED_COMMENT, *listed)]
    statement = body[anchors[0]]
    body[anchors[0]] = statement.with_changes(leading_lines=[*statement.leading_lines, *lines])
    return tree.with_changes(body=body)


def _names_in(node: cst.CSTNode) -> list[cst.Name]:
    found: list[cst.Name] = []

    class Collect(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            found.append(name)

    node.visit(Collect())
    return found


def _is_import(statement: cst.SimpleStatementLine) -> bool:
    return all(isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body)


def _dotted(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def fresh_name(name: str, bound: set[str]) -> str:
    """`name`, or `name2`, `name3`, ... when the script binds it already."""
    candidate, number = name, 1
    while candidate in bound:
        number += 1
        candidate = f"{name}{number}"
    return candidate


def _module_file(star: cst.ImportFrom, path: str | None) -> Path | None:
    """The file of the module a star import reads, when it sits next to the script."""
    if path is None or star.module is None:
        return None
    folder = Path(path).resolve().parent
    for _ in range(max(len(star.relative) - 1, 0)):
        folder = folder.parent
    base = folder.joinpath(*_dotted(star.module).split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _star_imported_names(stars: list[cst.ImportFrom], path: str | None) -> set[str]:
    """Every name the modules of `stars` mention (a superset of what they export), for
    those next to the script; the others' names count where the script reads them."""
    names: set[str] = set()
    for star in stars:
        file = _module_file(star, path)
        if file is None:
            continue
        try:
            names |= _Uses.of(cst.parse_module(file.read_text(encoding="utf-8"))).names
        except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
            names |= INSERTED.keys()  # unreadable: every inserted name counts as used
    return names
