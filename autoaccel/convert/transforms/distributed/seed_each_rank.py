"""Each process draws its own random numbers once training starts.

A script that seeds (`torch.manual_seed(opt.seed)`) gives every process the same random
stream: a GAN's noise is the same on every GPU (the global batch holds 1/WORLD_SIZE as
many distinct samples, as pytorch/examples' dcgan did), and dropout masks repeat across
GPUs. Just before the first statement that trains, when every process has built the
same model and data, each one re-seeds with the seed plus its rank. A single process
keeps its stream: the re-seed runs only when distributed.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.rank_guards import mentions_rank
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    RANK,
    DistributedStep,
    parse_statements,
)

_RESEED = f"""\
# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if {DISTRIBUTED}:
    torch.manual_seed(torch.initial_seed() + {RANK})
"""


class SeedEachRank(DistributedStep):
    DESCRIPTION = "Re-seed each process with its rank when training starts."
    needs = ("seed",)

    def visit_Module(self, node: cst.Module) -> None:
        seeds = self.seed_calls(node)
        if not seeds or any(mentions_rank(arg.value) for call in seeds for arg in call.args):
            return  # unseeded processes already differ; or seeded per rank by the author
        start = next((m.training for m in self.trained_models(node) if m.training), None)
        for seed in seeds if start is None else ():  # the model is built elsewhere (a Trainer's `__init__`)
            block = self.scope_block(seed)
            seeding = self.statement_of(seed)
            later = block.body[block.body.index(seeding) + 1:] if seeding in block.body else []
            start = next((s for s in later if self.script.runs_training(s)), None)
            if start is not None:
                break
        if start is None:
            self.skipped(
                "per-process seed",
                "every process draws the same random numbers (noise, dropout); re-seed each"
                f" with `torch.manual_seed(seed + {RANK})` once the model is built, by hand",
                seeds[0],
            )
            return
        self.before.setdefault(start, []).extend(parse_statements(_RESEED))
        self.changed(start, f"each process re-seeded with seed + {RANK} before training")
