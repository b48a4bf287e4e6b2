"""The process group destroyed after the sharded models are freed.

FSDP2's state keeps a sharded model alive in reference cycles after `main()` returns;
freed only at interpreter exit, after the process group, its communication state aborts
the process ("terminate called without an active exception", exit -6) in about a
quarter of CPU runs that evaluate after training. A garbage collection before
`destroy_process_group()` frees it first: 0 aborts in 14 runs of the same script.
"""

from __future__ import annotations

from autoaccel.convert.transforms.distributed.destroy_process_group import DestroyProcessGroup


class DestroyAfterModels(DestroyProcessGroup):
    DESCRIPTION = "Free the sharded models, then destroy the process group at the end of the script."
    ending = (
        "# free the sharded models first: left for the exit, after the process group,\n"
        "# they can abort the process\n"
        "gc.collect()\n"
        "dist.destroy_process_group()\n"
    )
    imports_needed = ("import gc",)
