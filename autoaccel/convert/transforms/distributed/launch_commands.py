"""The report ends with how to start the converted script (and the launcher file)."""

from __future__ import annotations

import libcst as cst

from autoaccel.convert.launch import companion_files, launch_lines
from autoaccel.convert.transforms.distributed._base import DistributedStep, has_setup_block

DEFAULT_SCRIPT = "train.py"  # when the context names no file


class LaunchCommands(DistributedStep):
    DESCRIPTION = "Tell how to launch the converted script."

    def transform_module(self, tree: cst.Module) -> cst.Module:
        if self.in_entry_script and has_setup_block(tree):  # reads the tree only: no metadata pass
            script = self.context.filename or DEFAULT_SCRIPT
            self.log.launch = launch_lines(script, self.options.launcher)
            self.log.extra_files.update(companion_files(script, self.options.launcher))
        return tree
