"""Each process draws its own random numbers once training starts.

A script that seeds (`torch.manual_seed(opt.seed)`) gives every process the same random
stream: a GAN's noise is the same on every GPU (the global batch holds 1/WORLD_SIZE as
many distinct samples, as pytorch/examples' dcgan did), and dropout masks repeat across
GPUs. Just before the first statement that trains, when every process has built the
same model and data, each one re-seeds with the seed plus its rank. A single process
keeps its stream: the re-seed runs only when distributed.

A script that does not seed but draws random numbers before training (pytorch/examples'
regression draws the polynomial it fits: `W_target = torch.randn(...)`) would build
something different on every process: each would fit its own target, and a loop that runs
until the loss is small would never stop. Every process then takes rank 0's seed right
after the set-up block, and re-seeds with its rank before training as above.
"""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.fresh_data import RANDOM_DRAWS
from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.rank_guards import mentions_rank
from autoaccel.analysis.shapes import find
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    RANK,
    DistributedStep,
    fresh_name,
    parse_statements,
    setup_block_end,
)
from autoaccel.convert.transforms.inserted_names import variable_names
from autoaccel.cst_edit import keyword_value

_RESEED = f"""\
# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if {DISTRIBUTED}:
    torch.manual_seed(torch.initial_seed() + {RANK})
"""
_SEED_ALIKE = f"""\
# Not seeded, and random numbers are drawn before training: every process takes rank 0's
# seed, to build the same model, data and targets.
if {DISTRIBUTED}:
    {{seed}} = [torch.initial_seed()]
    dist.broadcast_object_list({{seed}}, src=0)
    torch.manual_seed({{seed}}[0])
"""


class SeedEachRank(DistributedStep):
    DESCRIPTION = "Re-seed each process with its rank when training starts."
    needs = ("seed", "rand", "normal", "bernoulli", "multinomial", "poisson")

    def visit_Module(self, node: cst.Module) -> None:
        seeds = self.seed_calls(node)
        if not seeds and self.in_entry_script:
            self._seed_alike(node)
            return
        if not seeds or any(mentions_rank(arg.value) for call in seeds for arg in call.args):
            return  # unseeded processes already differ; or seeded per rank by the author
        start = next((m.training for m in self.trained_models(node) if m.training), None)
        for seed in (
            seeds if start is None else ()
        ):  # the model is built elsewhere (a Trainer's `__init__`)
            block = self.scope_block(seed)
            seeding = self.statement_of(seed)
            later = block.body[block.body.index(seeding) + 1 :] if seeding in block.body else []
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

    def _seed_alike(self, module: cst.Module) -> None:
        """In a script that does not seed but draws random numbers before training: rank
        0's seed for every process after the set-up block, and a re-seed by rank before
        training. (Otherwise unseeded processes differ already, as they should.)"""
        start = next((m.training for m in self.trained_models(module) if m.training), None)
        if start is None or not self._draws_before(module, start):
            return
        seed = fresh_name("shared_seed", variable_names(module))
        setup = setup_block_end(module)
        self.after.setdefault(setup, []).extend(parse_statements(_SEED_ALIKE.format(seed=seed)))
        self.changed(
            setup,
            "every process seeded with rank 0's seed: the script draws random numbers before training",
        )
        self.before.setdefault(start, []).extend(parse_statements(_RESEED))
        self.changed(start, f"each process re-seeded with seed + {RANK} before training")

    def _draws_before(self, module: cst.Module, start: cst.BaseStatement) -> bool:
        """Whether the statements that run before `start` (those before it in its block,
        and the module's own) draw from torch's global generator, directly or in the
        functions of the project they call."""
        block = self.scope_block(start)
        body = list(block.body)
        statements = body[: body.index(start)] if start in body else []
        if block is not module:
            statements += [s for s in module.body if not self.script.runs_training(s)]
        return any(
            self._draws(call, self.script.index, set())
            for statement in statements
            if not isinstance(statement, (cst.FunctionDef, cst.ClassDef))
            for call in find(statement, cst.Call)
        )

    def _draws(self, call: cst.Call, index: ModuleIndex, seen: set) -> bool:
        """Whether `call` (of the module `index` indexes) draws from the global generator,
        or runs a function of the project that does."""
        if index.qualified_names(call.func) & RANDOM_DRAWS:
            return keyword_value(call, "generator") is None
        for function in self.script.callees(call) - seen:
            seen.add(function)
            inner = function.module.index
            if any(self._draws(c, inner, seen) for c in find(function.node.body, cst.Call)):
                return True
        return False
