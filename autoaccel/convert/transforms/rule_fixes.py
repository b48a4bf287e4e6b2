"""Transforms that apply lint-rule fixes: one rule, one place, for lint and convert."""

from __future__ import annotations

import libcst as cst
from libcst.codemod import Codemod

from autoaccel.config import LintSettings
from autoaccel.convert.log import Change, ConvertOptions, Skipped
from autoaccel.convert.transform import source_of, step_context, tree_facts
from autoaccel.diff import original_line
from autoaccel.lint.fixer import FixResult, fix_source
from autoaccel.lint.rule import Applicability, Diagnostic


class RuleFixes(Codemod):
    """Apply the safe fixes of `codes`, and the unsafe ones of `speed_ups` (converting
    asks for them); other unsafe fixes may change what trains, so they are listed as
    not changed."""

    DESCRIPTION = "Apply lint-rule fixes."
    codes: tuple[str, ...] = ()  # set by subclasses
    speed_ups: tuple[str, ...] = ()
    logs_remaining = True  # the findings left, as "not changed" items

    @classmethod
    def enabled(cls, options: ConvertOptions) -> bool:
        return True

    def selected_codes(self, options: ConvertOptions) -> tuple[str, ...]:
        """The codes whose fixes these options ask for."""
        return self.codes

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        shared = step_context(self.context)
        codes = self.selected_codes(shared.options)
        settings = LintSettings(select=codes, extend_safe_fixes=self.speed_ups)
        source = source_of(self.context, tree)
        result = fix_source(
            source, settings, project=shared.project, module=tree, module_code=shared.module_code
        )
        log = shared.log
        for diagnostic in result.fixed:
            log.changes.append(Change(diagnostic.code, diagnostic.line, diagnostic.fix_title or ""))
        if self.logs_remaining:
            for diagnostic in result.remaining:
                # a line of the fixed text; the log's are lines of the text this step received
                line = original_line([(source, result.source)], diagnostic.line)
                log.skipped.append(
                    Skipped(f"{diagnostic.code} ({diagnostic.name})", line, _reason(diagnostic))
                )
            for note in result.notes:
                log.skipped.append(Skipped(f"{note.code} ({note.name})", note.line, note.reason))
        if result.source == source:
            return self._analysed(tree, result)
        if result.module is None:
            return cst.parse_module(result.source)
        return self._analysed(result.module, result)

    def _analysed(self, tree: cst.Module, result: FixResult) -> cst.Module:
        """`tree`, the fixed module, with the script model the rules saw kept for the
        next step (the same analysis, ~75 ms at 2,000 lines; not in a project, where
        steps analyse the other modules as they are then)."""
        if result.script is not None and step_context(self.context).project is None:
            tree_facts(self.context, tree).script = result.script
        return tree

    def transform_module(self, tree: cst.Module) -> cst.Module:
        """Without LibCST's copy of the tree for its metadata: none is asked for (the
        lint analysis has its own)."""
        return self.transform_module_impl(tree)


class SingleProcessFixes(RuleFixes):
    """The single-process speed-ups that lint rules already know how to fix, applied
    together so the file is analysed once per round rather than once per rule."""

    DESCRIPTION = "Apply the speed-up and modernisation fixes of the lint rules."
    codes = (
        "ACC501",  # Variable wrappers
        "ACC502",  # volatile=True
        "ACC503",  # loss.data[0]
        "ACC504",  # evaluation without no_grad
        "ACC203",  # losses accumulated with their graphs
        "ACC201",  # cudnn.benchmark
        "ACC101",  # DataLoader workers
        "ACC102",  # pinned memory
        "ACC104",  # shuffle with a sampler
        "ACC103",  # non_blocking batch copies
        "ACC206",  # tensors created on the CPU then moved
        "ACC302",  # torch.cuda.amp / torch.cpu.amp spellings
    )
    # Unsafe for memory, synchronisation or determinism, never for what is computed.
    speed_ups = ("ACC101", "ACC103", "ACC201")

    def selected_codes(self, options: ConvertOptions) -> tuple[str, ...]:
        if options.workers == "keep":
            return tuple(code for code in self.codes if code != "ACC101")
        return self.codes


class FixesThroughNewImports(SingleProcessFixes):
    """The same fixes once more, after the other steps, in a module that takes names
    from a star import (`from model import *` bringing `torch`). The rules cannot tell
    what such a name is until a step imports it (`import torch` of the multi-GPU set-up),
    and a conversion must be a fixed point: what the rules then fix is fixed now, not by
    the next conversion. Only the fixes are logged; the first run logged what is left."""

    logs_remaining = False

    def transform_module(self, tree: cst.Module) -> cst.Module:
        if not any(_is_star_import(statement) for statement in tree.body):
            return tree
        return super().transform_module(tree)


def _is_star_import(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, cst.ImportFrom) and isinstance(small.names, cst.ImportStar)
        for small in statement.body
    )


def _reason(diagnostic: Diagnostic) -> str:
    """Why a finding is left: the problem, and for an unsafe fix how to apply it."""
    if diagnostic.fix_applicability is not Applicability.UNSAFE:
        return diagnostic.message
    return (
        f"{diagnostic.message}. The fix may change what trains; review it, then apply it with"
        f" `autoaccel lint --fix --unsafe-fixes --select {diagnostic.code}`"
    )
