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

from autoaccel.analysis.fresh_data import HOST_DRAWS, RANDOM_DRAWS
from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.rank_guards import mentions_rank
from autoaccel.analysis.shapes import find
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    RANK,
    MANUAL_SEED,
    DistributedStep,
    fresh_name,
    parse_statements,
    setup_block_end,
)
from autoaccel.convert.transforms.distributed.shard_batch_rounds import shared_loops
from autoaccel.convert.transforms.inserted_names import variable_names
from autoaccel.cst_edit import bound_name, code_of, keyword_value

_RESEED = f"""\
# Same model and data on every process so far; from here each draws its own random
# numbers (noise, dropout, augmentation), as the GPUs of one big batch would.
if {DISTRIBUTED}:
{{lines}}"""
_UNSEEDED = """\
# Not seeded, and random numbers are drawn before training: every process takes rank 0's
# seed, to build the same model, data and targets.
"""
_PARTLY_SEEDED = """\
# {generators}: not seeded, and drawn from before training. Every process takes rank 0's
# seed, to build the same data.
"""
_SHARED_BATCHES = """\
# {generators}: not seeded. Every process takes rank 0's seed, to make the same batches
# (each trains on its share of them).
"""
_SEED_ALIKE = f"""\
{{comment}}if {DISTRIBUTED}:
    {{seed}} = [torch.initial_seed()]
    dist.broadcast_object_list({{seed}}, src=0)
{{lines}}"""
_TORCH, _PYTHON, _NUMPY = "torch", "random", "numpy.random"
# Each global generator: the calls that seed it, and those that draw from it before
# training (torch's `random_split` draws a permutation: a held-out split).
_SEEDS = {
    _TORCH: frozenset({MANUAL_SEED}),
    _PYTHON: frozenset({"random.seed"}),
    _NUMPY: frozenset({"numpy.random.seed"}),
}
_DRAWS = {
    _TORCH: RANDOM_DRAWS
    | {"torch.utils.data.random_split", "torch.utils.data.dataset.random_split"},
    _PYTHON: frozenset(n for n in HOST_DRAWS if n.startswith("random.")),
    _NUMPY: frozenset(n for n in HOST_DRAWS if n.startswith("numpy.random.")),
}
# How each generator is seeded alike from `{seed}`, and per process before training.
_ALIKE = {
    _TORCH: "torch.manual_seed({seed}[0])",
    _PYTHON: "random.seed({seed}[0])",
    _NUMPY: "{np}.random.seed({seed}[0] % 2**32)",
}
# A generator the script seeds itself and draws from in training (SincNet's batches come
# from `np.random` after `np.random.seed(seed)`): offset by the rank from its own stream,
# which every process has seeded alike, so runs stay reproducible.
_OWN_PER_RANK = {
    _PYTHON: f"random.seed(random.getrandbits(64) + {RANK})",
    _NUMPY: f"{{np}}.random.seed((int({{np}}.random.get_state()[1][0]) + {RANK}) % 2**32)",
}
_PER_RANK = {
    _TORCH: f"torch.manual_seed(torch.initial_seed() + {RANK})",
    _PYTHON: f"random.seed({{seed}}[0] + {RANK})",
    _NUMPY: f"{{np}}.random.seed(({{seed}}[0] + {RANK}) % 2**32)",
}


class SeedEachRank(DistributedStep):
    DESCRIPTION = "Re-seed each process with its rank when training starts."
    # (no `needs` words: the draws may be in any module of the project, bprmf's `data.py`;
    # with them, the step ran only once another step's helper said "seed")

    def visit_Module(self, node: cst.Module) -> None:
        seeds = self.seed_calls(node)
        if any(mentions_rank(arg.value) for call in seeds for arg in call.args):
            return  # seeded per rank by the author
        if self.in_entry_script and shared_loops(self.script):
            self._seed_alike(node, bool(seeds))
            return
        start = self._seeded_start(node, seeds) if seeds else self._training_start(node)
        if start is None:
            return
        alike = self._drawn_unseeded(node, start, seeds) if self.in_entry_script else []
        own = [
            g
            for g in (_PYTHON, _NUMPY)
            if g not in alike
            and (calls := self.seed_calls(node, _SEEDS[g]))
            and not any(mentions_rank(a.value) for c in calls for a in c.args)
            and self._draws_from(start, g)
        ]
        if not seeds and not alike and not own:
            return  # unseeded processes already differ, as they should
        names = self._names(node, alike + own)
        if alike:
            comment = _PARTLY_SEEDED.format(generators=_listed(alike))
            self._seed_at_setup(node, alike, _UNSEEDED if _TORCH in alike else comment, names)
            self.changed(
                setup_block_end(node),
                f"every process seeds {_listed(alike)} with rank 0's seed: the script draws"
                " random numbers before training",
            )
        per_rank = [_TORCH] * bool(seeds) + alike
        reseeds = [_PER_RANK[g] for g in per_rank] + [_OWN_PER_RANK[g] for g in own]
        lines = "".join(f"    {line}\n" for line in reseeds).format(**names)
        self.before.setdefault(start, []).extend(parse_statements(_RESEED.format(lines=lines)))
        self.changed(start, f"each process re-seeded with seed + {RANK} before training")

    def _seed_alike(self, module: cst.Module, torch_seeded: bool) -> None:
        """Batches that no DataLoader makes are shared out by rounds (`ShardBatchRounds`):
        every process must make the same ones, so none is re-seeded by rank, and those of
        the global generators the script may draw from but never seeds take rank 0's seed:
        Python's always (a library's batch iterator may shuffle with it: torchtext's
        `BucketIterator`), NumPy's where the program imports it."""
        unseeded = [_TORCH] * (not torch_seeded) + [
            g
            for g in (_PYTHON, _NUMPY)
            if not self.seed_calls(module, _SEEDS[g])
            and (g == _PYTHON or self._imported(module, g))
        ]
        self.changed(
            setup_block_end(module),
            "no process is re-seeded by its rank: every process makes the same batches, and"
            " trains on its share of them",
        )
        if unseeded:
            comment = _SHARED_BATCHES.format(generators=_listed(unseeded))
            self._seed_at_setup(module, unseeded, comment, self._names(module, unseeded))

    def _names(self, module: cst.Module, generators: list[str]) -> dict[str, str]:
        """The names the seeding code reads: a fresh one for rank 0's seed, and the
        module's name of NumPy (imported as `np` where `generators` need it and it is not)."""
        names = {"seed": fresh_name("shared_seed", variable_names(module)), "np": "np"}
        if _NUMPY in generators:
            numpy = self._numpy_name(module)
            names["np"] = numpy or "np"
            if numpy is None:
                self.imports.append("import numpy as np")
        return names

    def _seed_at_setup(
        self, module: cst.Module, generators: list[str], comment: str, names: dict[str, str]
    ) -> None:
        """After the set-up block: every process seeds `generators` with rank 0's seed."""
        lines = "".join(f"    {_ALIKE[g]}\n" for g in generators).format(**names)
        code = _SEED_ALIKE.format(comment=comment, seed=names["seed"], lines=lines)
        self.after.setdefault(setup_block_end(module), []).extend(parse_statements(code))
        self.imports += ["import random"] * (_PYTHON in generators)

    def _imported(self, module: cst.Module, generator: str) -> bool:
        """Whether a module of the program imports `generator`'s module (`random`, `numpy`)."""
        program = self.script.program
        trees = [m.tree for m in program.modules] if program is not None else [module]
        imported: list[str] = []
        for tree in trees:
            for statement in find(tree, (cst.Import, cst.ImportFrom)):
                if isinstance(statement, cst.Import):
                    imported += [code_of(alias.name) for alias in statement.names]
                elif isinstance(statement, cst.ImportFrom) and statement.module is not None:
                    imported.append(code_of(statement.module))
        top = generator.split(".")[0]
        return any(name.split(".")[0] == top for name in imported)

    def _training_start(self, module: cst.Module) -> cst.BaseStatement | None:
        """The statement that starts training the first model trained in `module`."""
        return next((m.training for m in self.trained_models(module) if m.training), None)

    def _seeded_start(self, module: cst.Module, seeds: list[cst.Call]) -> cst.BaseStatement | None:
        """Where training starts after the script seeds; None, said, when not found. Not in
        a function run more than once (`train_one_epoch(model, ...)` called per epoch: a
        re-seed there would repeat one random stream every epoch), but where the seeded
        code starts it (`fit(loader, teacher)` in `main()`)."""
        start = self._training_start(module)
        if start is not None and not self._runs_once(self.scope_of(start)):
            start = None
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
        return start

    def _runs_once(self, scope: cst.CSTNode | None, depth: int = 0) -> bool:
        """Whether the code of `scope` (a function, None: the module) runs once a run: the
        module's, or a function called from one place outside any loop, by code that
        runs once."""
        program = self.script.program
        if scope is None or not isinstance(scope, cst.FunctionDef):
            return True
        if program is None or depth > 8:
            return False
        function = next((f for f in program.functions.values() if f.node is scope), None)
        calls = program.calls_of(function) if function is not None else []
        if len(calls) != 1:
            return False
        (call,) = calls
        index = program.module_of[call].index
        for ancestor in index.ancestors(call):
            if isinstance(ancestor, (cst.For, cst.While)):
                return False
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                return isinstance(ancestor, cst.FunctionDef) and self._runs_once(
                    ancestor, depth + 1
                )
        return True

    def _drawn_unseeded(
        self, module: cst.Module, start: cst.BaseStatement, seeds: list[cst.Call]
    ) -> list[str]:
        """The global generators (torch's, Python's, NumPy's) that the script never seeds
        and that draw random numbers before `start`: each process would build its own model,
        data split or targets. torch's counts as seeded when `seeds` is not empty."""
        unseeded = [g for g in (_PYTHON, _NUMPY) if not self.seed_calls(module, _SEEDS[g])]
        return [
            g for g in [_TORCH] * (not seeds) + unseeded if self._draws_before(module, start, g)
        ]

    @staticmethod
    def _numpy_name(module: cst.Module) -> str | None:
        """The name the module's `import numpy [as np]` binds, if it has one."""
        for statement in module.body:
            simple = statement.body if isinstance(statement, cst.SimpleStatementLine) else ()
            for small in simple:
                for alias in small.names if isinstance(small, cst.Import) else ():
                    if code_of(alias.name) == "numpy":
                        return bound_name(alias)
        return None

    def _draws_before(self, module: cst.Module, start: cst.BaseStatement, generator: str) -> bool:
        """Whether the statements that run before `start` (those before it in its block,
        and the module's own) draw from the global `generator`."""
        block = self.scope_block(start)
        body = list(block.body)
        statements = body[: body.index(start)] if start in body else []
        if block is not module:
            statements += [s for s in module.body if not self.script.runs_training(s)]
        return self._any_draws(statements, generator)

    def _draws_from(self, start: cst.BaseStatement, generator: str) -> bool:
        """Whether `start` or the statements after it in its block draw from the global
        `generator` (the training does)."""
        body = list(self.scope_block(start).body)
        return self._any_draws(body[body.index(start) :] if start in body else [start], generator)

    def _any_draws(self, statements: list[cst.BaseStatement], generator: str) -> bool:
        """Whether `statements` (not the definitions among them) draw from the global
        `generator`, directly or in the functions of the project they call."""
        index = self.script.index
        assert index is not None
        return any(
            self._draws(call, index, generator, set())
            for statement in statements
            if not isinstance(statement, (cst.FunctionDef, cst.ClassDef))
            for call in find(statement, cst.Call)
        )

    def _draws(self, call: cst.Call, index: ModuleIndex, generator: str, seen: set) -> bool:
        """Whether `call` (of the module `index` indexes) draws from the global
        `generator`, or runs a function of the project that does."""
        if index.qualified_names(call.func) & _DRAWS[generator]:
            return keyword_value(call, "generator") is None
        for function in self.script.callees(call) - seen:
            seen.add(function)
            inner = function.module.index
            if any(
                self._draws(c, inner, generator, seen) for c in find(function.node.body, cst.Call)
            ):
                return True
        return False


def _listed(generators: list[str]) -> str:
    """`torch, random and numpy.random`: the modules whose generators are seeded."""
    return " and ".join(filter(None, [", ".join(generators[:-1]), generators[-1]]))
