"""Transforms that apply lint-rule fixes: one rule, one place, for lint and convert."""

from __future__ import annotations

import libcst as cst
from libcst.codemod import Codemod

from autoaccel.config import LintSettings
from autoaccel.convert.log import Change, Skipped
from autoaccel.convert.transform import LOG_KEY
from autoaccel.lint.fixer import fix_source


class RuleFixes(Codemod):
    """Apply the fixes of `codes` (unsafe ones included: the user asked for them)."""

    DESCRIPTION = "Apply lint-rule fixes."
    codes: tuple[str, ...] = ()

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        settings = LintSettings(select=self.codes, unsafe_fixes=True)
        result = fix_source(tree.code, settings)
        log = self.context.scratch[LOG_KEY]
        for diagnostic in result.fixed:
            log.changes.append(Change(diagnostic.code, diagnostic.line, diagnostic.fix_title or ""))
        for diagnostic in result.remaining:
            log.skipped.append(
                Skipped(f"{diagnostic.code} ({diagnostic.name})", diagnostic.line, diagnostic.message)
            )
        return tree if result.source == tree.code else cst.parse_module(result.source)


class EnableCudnnBenchmark(RuleFixes):
    DESCRIPTION = "Set torch.backends.cudnn.benchmark = True after the imports."
    codes = ("ACC201",)


class TuneDataLoaders(RuleFixes):
    DESCRIPTION = "Worker processes, persistent workers and pinned memory for DataLoaders."
    codes = ("ACC101", "ACC102", "ACC104")


class NonBlockingCopies(RuleFixes):
    DESCRIPTION = "non_blocking=True on batch copies inside the step loops."
    codes = ("ACC103",)


class CreateOnDevice(RuleFixes):
    DESCRIPTION = "Create tensors on their device instead of moving them."
    codes = ("ACC206",)


class ReleaseStepGraphs(RuleFixes):
    DESCRIPTION = "Accumulate losses without keeping every step's autograd graph."
    codes = ("ACC203",)


class ModernizeLegacy(RuleFixes):
    DESCRIPTION = "Remove PyTorch 0.3 idioms that fail or do nothing on current torch."
    codes = ("ACC501", "ACC502", "ACC503", "ACC504")
