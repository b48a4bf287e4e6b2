"""Each process loads its own shard of the training data, and the global batch stays.

The training DataLoader gets a `DistributedSampler` (only when distributed: plain
`python` keeps the original sampler and shuffle); the loader's `shuffle` moves into the
sampler. By default each process loads `batch_size // WORLD_SIZE` samples, so the
global batch, and with it the learning-rate settings, stay as they were (a warning
when it does not divide); `--per-process-batch` keeps the batch size per process.

A training loop that reads no DataLoader is sharded where each process draws its own
batches; when its steps run under a condition each process computes from its own data
(a DQN learns once its replay buffer holds enough), the condition goes through
`every_process()`, which all-reduces it, where every process reaches it as often.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.fresh_data import HOST_SEEDS, Generator, fresh_draws
from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.loss_reduction import reaching_values
from autoaccel.analysis.names import name_key
from autoaccel.analysis.permuted_rows import permuted_batches
from autoaccel.analysis.phases import phases_of
from autoaccel.analysis.program import FunctionInfo, Kind, SourceModule
from autoaccel.analysis.rank_guards import mentions_rank, names_in
from autoaccel.analysis.script_model import LoopRole, Missing, ScriptModel
from autoaccel.analysis.shapes import bound_names, find, is_name, is_no_grad_block, is_true
from autoaccel.analysis.training import StepLoop
from autoaccel.convert.log import DIFFERENT_DATA
from autoaccel.convert.transforms.distributed._base import (
    DIST_IMPORT,
    DISTRIBUTED,
    RANK,
    WORLD_SIZE,
    DistributedStep,
    fresh_name,
    parse_statements,
    uncalled_function,
)
from autoaccel.convert.transforms.distributed.loader_flags import (
    Flag,
    Split,
    training_readers,
    training_splits,
    unselected_loaders,
)
from autoaccel.convert.transforms.distributed.shard_batch_rounds import (
    carried_state,
    round_draws,
    rounds,
    shared_loops,
    step_sites,
)
from autoaccel.convert.transforms.distributed.shard_stream_columns import (
    batch_source,
    reads_batchified,
    slices_by_counter,
    walks_by_pointer,
)
from autoaccel.convert.transforms.distributed.stop_together import (
    EVERY_PROCESS,
    agreed,
    agreement_helper,
)
from autoaccel.convert.transforms.inserted_names import variable_names
from autoaccel.cst_edit import code_of, first_line_of, keyword_value, set_keyword

_FUNCTIONS = (cst.FunctionDef, cst.Lambda)
SAMPLER_IMPORT = "from torch.utils.data.distributed import DistributedSampler"
# In a refusal that a run of the script can answer (see `convert.command.needs_facts`).
LOADERS_RUN_CAN_TELL = "a short run of the script can show which loader trains"
WEIGHTED_SAMPLERS = frozenset(
    {"torch.utils.data.WeightedRandomSampler", "torch.utils.data.sampler.WeightedRandomSampler"}
)
RANDOM_SAMPLERS = frozenset(
    {"torch.utils.data.RandomSampler", "torch.utils.data.sampler.RandomSampler"}
)
SHARED_DRAW = "ShardedDraws"
_SHARED_DRAW_CLASS = f'''

class {SHARED_DRAW}(torch.utils.data.Sampler):
    """Each process reads its share of what `sampler` draws: all draw the same indices
    (one generator, seeded alike) and each keeps every {WORLD_SIZE}-th from its {RANK}.
    Together they read exactly one draw of the original sampler, weights and all."""

    def __init__(self, sampler):
        if sampler.generator is None:  # the global RNG, which each process re-seeds
            seed = torch.tensor(torch.initial_seed() % 2**63)
            dist.broadcast(seed, src=0)
            sampler.generator = torch.Generator().manual_seed(int(seed))
        self.sampler = sampler

    def __iter__(self):
        indices = list(self.sampler)
        # equal shares (padded with the first indices, as DistributedSampler pads)
        indices += indices[: -len(indices) % {WORLD_SIZE}]
        return iter(indices[{RANK}::{WORLD_SIZE}])

    def __len__(self):
        return -(-len(self.sampler) // {WORLD_SIZE})
'''
SHARDED_STREAM = "ShardedStream"
_SHARDED_STREAM_CLASS = f'''

class {SHARDED_STREAM}(torch.utils.data.IterableDataset):
    """Each process, and each DataLoader worker in it, reads its own share of `dataset`:
    of every {WORLD_SIZE} x workers items in a row, the one at its place. An incomplete
    last round is left out, so that every process takes as many steps."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        workers, worker_id = (worker.num_workers, worker.id) if worker else (1, 0)
        rounds = zip(*[iter(self.dataset)] * ({WORLD_SIZE} * workers))
        return (items[{RANK} * workers + worker_id] for items in rounds)
'''
_EVERY_PROCESS_CODE = agreement_helper(
    EVERY_PROCESS,
    "every process: then every process takes the branch",
    "dist.all_reduce(flag, op=dist.ReduceOp.MIN)",
)
BATCH_HELPER = "per_process_batch_size"
# Who decides a guess about how each process draws its data.
_DECIDED = (
    "the proof run before writing checks that the processes train on different data;"
    " `--no-verify` refuses, `--allow-partial` writes it unchecked"
)
BATCH_HELPER_CODE = f'''
def {BATCH_HELPER}(global_batch_size):
    """Each process loads an equal share of the original (global) batch."""
    share = max(1, global_batch_size // {WORLD_SIZE})
    if global_batch_size % {WORLD_SIZE}:
        warnings.warn(
            f"batch size {{global_batch_size}} does not divide by {{{WORLD_SIZE}}} processes:"
            f" each loads {{share}}, {{share * {WORLD_SIZE}}} in all; give a batch size that"
            f" divides by {{{WORLD_SIZE}}} to keep the global batch"
        )
    return share
'''

# What a process reads of data that is walked in order: a part of its own, in one piece.
_CONTIGUOUS_PARTS = (
    "give each process its own contiguous part by hand (equal parts:"
    f" `data.chunk({WORLD_SIZE})[{RANK}]` of a tensor whose length divides by {WORLD_SIZE}),"
    " so that all take as many steps"
)


class ShardTrainLoader(DistributedStep):
    DESCRIPTION = "Give the training DataLoader a DistributedSampler and a per-process batch."

    def visit_Module(self, node: cst.Module) -> None:
        self.tree = node
        self.calls: dict[cst.Call, dict[str, str]] = {}  # loader call -> keyword -> new value
        self.datasets: dict[cst.CSTNode, str] = {}  # dataset argument -> hoisted name
        # what a hoisted `dataset` / `sampler` must not be called: any name of the script
        self.bound = {name_key(t.target) for t in find(node, cst.AssignTarget)} | variable_names(
            node
        )
        self.helper_needed = False
        self.shared_draws_needed = False
        self.streams: set[cst.CSTNode] = set()  # dataset arguments wrapped in ShardedStream
        self.draw_sizes: dict[cst.Element, str] = {}  # `(batch_size,)` of an offset draw
        self.agreed: set[cst.BaseExpression] = set()  # tests that go through `every_process()`
        unselected = unselected_loaders(self.script)
        self.loader_calls = loaders = train_loader_calls(self.script, unselected)
        self.splits = training_splits(self.script)
        for call, flag in unselected.items():
            self._leave_whole(
                call,
                f"`{flag.function.name}()` makes it only where `{flag.name}` is {flag.value},"
                f" and the training loops read its calls with `{flag.name}={not flag.value}`",
            )
        for call, phase in self._evaluation_phases().items():
            loaders.discard(call)
            self._leave_whole(
                call,
                f"the training loop reads it in its `{phase}` phase, in which no backward()"
                " runs: an evaluation",
            )
        for call, batches in self._untrained(loaders).items():
            loaders.discard(call)
            self._leave_whole(
                call,
                f"the run of the script showed it: no backward() followed any of its {batches}"
                " batches, while one followed those of another DataLoader",
            )
        self._refuse_unsplit_evaluation(loaders)
        shared = shared_loops(self.script)
        for loop in self.script.step_loops.values():
            if loop.role is not LoopRole.TRAIN or loop.loaders or loop in shared:
                continue  # ShardBatchRounds gives each process its share of `shared`
            if reads_batchified(loop.node, node):
                continue  # ShardStreamColumns gives each process its columns
            self._shard_without_loader(node, loop)
        for call in sorted(loaders, key=self.line_of):
            if not self.shards(node, call):
                self._shard(call)
        if self.helper_needed:
            self.define_helper(node, BATCH_HELPER, BATCH_HELPER_CODE)
            self.imports.append("import warnings")
        if self.shared_draws_needed:
            self.define_helper(node, SHARED_DRAW, _SHARED_DRAW_CLASS)
        if self.streams:
            self.define_helper(node, SHARDED_STREAM, _SHARDED_STREAM_CLASS)
        if self.agreed:
            self.define_helper(node, EVERY_PROCESS, _EVERY_PROCESS_CODE)
            self.imports.append(DIST_IMPORT)

    def _refuse_unsplit_evaluation(self, loaders: set[cst.Call]) -> None:
        """Refuse where one function that does not train makes several of the DataLoaders to
        shard (cs230's `fetch_dataloader()`: `if split == 'train': ... else: ...` in a loop
        over the splits): its validation loader would be sharded too, and each process would
        evaluate its share alone (fsdp combines no evaluation; ddp's `ShardEvaluation`
        only those of the script's own loops). A run of the script tells the loaders apart
        (`_untrained`)."""
        program = self.script.program
        if program is None:
            return
        made = Counter(program.function_of.get(call) for call in loaders)
        trains = {step.function for step in self.script.step_loops.values()}
        for function, count in made.items():
            if function is None or count < 2 or function in trains:
                continue  # (the function that trains: its loaders are alternatives)
            calls = sorted(
                (c for c in loaders if program.function_of.get(c) is function), key=self.line_of
            )
            if not self._split_by_shuffle(calls):
                continue  # alternatives (one per dataset, all shuffled): each is a training one
            first = calls[0]
            self.skipped(
                "DistributedSampler",
                f"`{function.node.name.value}()` makes {count} of the DataLoaders the training"
                " reads, and the code does not tell which one trains: a validation loader"
                " sharded too would have each process evaluate its share alone;"
                f" {LOADERS_RUN_CAN_TELL}",
                first,
                wrong=True,
            )

    @staticmethod
    def _split_by_shuffle(calls: list[cst.Call]) -> bool:
        """Whether some of `calls` shuffle and others do not: a training loader and an
        evaluation one (cs230's, melgan's), not alternatives of one (ACGAN's
        `dataloader(dataset, ...)`, one shuffled loader per dataset)."""
        shuffled = {is_true(keyword_value(call, "shuffle")) for call in calls}
        return len(shuffled) > 1

    def _leave_whole(self, call: cst.Call, why: str) -> None:
        self.skipped(
            "DistributedSampler",
            f"no training DataLoader: {why}; left whole: each process reads all of it",
            call,
        )

    def _evaluation_phases(self) -> dict[cst.Call, str]:
        """The DataLoader calls a training loop over `loaders[phase]` reads only in the
        phases that do not train (`fixtures/ddp/phase_loop.py`), each with its phase."""
        program, index = self.script.program, self.script.index
        if program is None or index is None or self.script.module is None:
            return {}
        found: dict[cst.Call, str] = {}
        trained: set[cst.CSTNode] = set()
        for step in self.script.step_loops.values():
            phases = phases_of(step, index) if step.role is LoopRole.TRAIN else None
            for phase, expression in phases.loaders.items() if phases else ():
                for obj in program.values_of(expression, self.script.module):
                    if obj.kind is not Kind.LOADER or not isinstance(obj.node, cst.Call):
                        continue
                    if phase in phases.training:  # type: ignore[union-attr]
                        trained.add(obj.node)
                    else:
                        found.setdefault(obj.node, phase)
        return {call: phase for call, phase in found.items() if call not in trained}

    def _keyed_name(self, call: cst.Call) -> str | None:
        """`train_loader` for the loader of `{"train": DataLoader(...), ...}`: its sampler
        is then `train_sampler`."""
        element = self.parent(call)
        key = element.key if isinstance(element, cst.DictElement) else None
        word = key.evaluated_value if isinstance(key, cst.SimpleString) else None
        return f"{word}_loader" if isinstance(word, str) and word.isidentifier() else None

    def _untrained(self, loaders: set[cst.Call]) -> dict[cst.Call, int]:
        """The calls among `loaders` of a helper that makes several of them (a training and
        a validation loader, chosen by a flag the analysis cannot read) whose every loader
        the fact run iterated, each batch without a backward() after it, while another
        loader fed one; each with the batches they handed out."""
        facts = self.run_facts()
        program = self.script.program
        if facts is None or program is None or not any(x.trains for x in facts.facts.loaders):
            return {}
        helper = {call: program.function_of.get(call) for call in loaders}
        several = {f for f, n in Counter(helper.values()).items() if f is not None and n > 1}
        made = {
            call: [x for x in facts.facts.loaders if facts.node_at(x.site) is call]
            for call in loaders
            if helper[call] in several
        }
        return {
            call: sum(x.batches for x in items)
            for call, items in made.items()
            if items and all(x.batches and not x.trains for x in items)
        }

    def _shard_without_loader(self, module: cst.Module, step: StepLoop) -> None:
        """A training loop that reads no DataLoader: left alone when the program never runs
        it; its processes draw their own batches when it draws them at random; refused
        otherwise, with what it reads instead."""
        unused = uncalled_function(step, self.script.program)
        if unused is not None:
            self.skipped(
                "DistributedSampler",
                f"this training loop is in `{unused.name}()`, which nothing in the program calls: left as it is",
                step.node,
            )
            return
        if permuted_batches(step, self.script) is not None:
            return  # ShardPermutedRows gives each process its rows
        # (a random start of a walk over all of the data draws no data: the walk is the data)
        generators = fresh_draws(step, self.script.program) or (
            frozenset() if walks_by_pointer(step) else round_draws(step, self.script)
        )
        if generators:
            self._draw_per_process(module, step, generators)
        elif (maker := self._batch_maker(step)) is not None:
            self.skipped(
                "DistributedSampler",
                f"this training loop takes its batches from `{code_of(maker.func)}()`, which makes them"
                " in a way the conversion cannot follow: if it draws them at random from a generator"
                f" no process seeds alike, each process draws its own ({_DECIDED}); if not,"
                f" give each process its share by hand (e.g. indices `{RANK}::{WORLD_SIZE}`)",
                maker,
                wrong=True,
                proof=DIFFERENT_DATA,
            )
        elif not slices_by_counter(step) and (round_site := self._round_loop(step)) is not None:
            site, where = round_site
            elsewhere = "" if where is self.script.module else f" of {where.path}"
            self.skipped(
                "DistributedSampler",
                f"this training loop trains on all of its data at every step, and `{first_line_of(site)}`"
                f" runs it inside a loop{elsewhere} that does more each round,"
                " such as collecting rollouts: if each process collects its own (its environment"
                f" and sampling seeded per process, or not at all), each trains on its own ({_DECIDED});"
                " if the data is the same everywhere, there is nothing to shard: train it on one process",
                step.node,
                wrong=True,
                proof=DIFFERENT_DATA,
            )
        elif not slices_by_counter(step):
            self.skipped(
                "DistributedSampler",
                "full-batch training: one graph per step, nothing to shard; every process"
                " would compute the same step on all of the data (train it on one process,"
                " or cut the data into batches first)",
                step.node,
                wrong=True,
            )
        elif walks_by_pointer(step):
            self.skipped(
                "DistributedSampler",
                "this training loop walks its data in order from a position it advances, so"
                f" every process would walk all of it; {_CONTIGUOUS_PARTS}",
                step.node,
                wrong=True,
            )
        elif state := carried_state(step.node):
            self.skipped(
                "DistributedSampler",
                "this training loop reads its data in order and hands"
                f" `{'`, `'.join(sorted(state))}` from each step to the next, so every process"
                " would read all of it, and a share of every other batch would break that chain;"
                f" {_CONTIGUOUS_PARTS}",
                step.node,
                wrong=True,
            )
        else:
            self.skipped(
                "DistributedSampler",
                "this training loop does not read a DataLoader, so every process trains on"
                " all of its data; give each process its share by hand (e.g. indices"
                f" `{RANK}::{WORLD_SIZE}`)",
                step.node,
                wrong=True,
            )

    def _batch_maker(self, step: StepLoop) -> cst.Call | None:
        """A call of the loop's body to a function of the project that returns what it cut
        from its data, and trains nothing itself: `random_training_set(chunk_len, n)`,
        whose `random` came by a star import of a module the project lacks. Not an
        evaluation (gcn's `evaluate(model, data)`, which computes under `torch.no_grad()`)."""
        for call in find(step.node.body, cst.Call):
            if not self._feeds_training(call, step):
                continue  # an early stopper's `check(evals)`: its result trains nothing
            for function in self.script.callees(call):
                if function.cls is not None and function.cls.is_module:
                    continue  # a model's forward
                body = function.node.body
                index = function.module.index
                if any(is_no_grad_block(w, index.qualified_names) for w in find(body, cst.With)):
                    continue  # an evaluation
                if (
                    function not in self.script.training.backpropagating
                    and find(body, cst.Subscript)
                    and any(r.value is not None for r in find(body, cst.Return))
                ):
                    return call
        return None

    def _feeds_training(self, call: cst.Call, step: StepLoop) -> bool:
        """Whether what `call` returns is bound to names that the loop passes to a model,
        or to a function that runs a backward pass (`inp, target = random_training_set()`
        then `train(inp, target)`)."""
        assign = self.parent(call)
        if not isinstance(assign, cst.Assign) or assign.value is not call:
            return False
        names = {n for t in assign.targets for n in bound_names(t.target)}
        training = self.script.training.backpropagating
        for other in find(step.node.body, cst.Call):
            passed = {name_key(n) for a in other.args for n in find(a.value, cst.Name)}
            if other is call or not passed & names:
                continue
            if self.script.callees(other) & training or any(
                o.kind is Kind.MODULE for o in self.script.values(other.func)
            ):
                return True
        return False

    def _draw_per_process(
        self, module: cst.Module, step: StepLoop, generators: frozenset[Generator]
    ) -> None:
        """A loop that samples new random batches every step: each process draws its own,
        unless every process seeds its generator alike (then they all draw the same), or
        the steps run under a condition each process computes from its own data and not
        all reach as often (one they all reach as often goes through `every_process()`)."""
        loop = step.node
        if Generator.HOST in generators and self._host_seeded_alike(module):
            return
        guards = self._uneven_guards(step)
        uncounted = [
            g
            for g, function in guards
            if isinstance(g, cst.While) or not self._counted(g, function)
        ]
        if uncounted:
            guard = uncounted[0]
            self.skipped(
                "DistributedSampler",
                f"the training steps, which draw their batches at random, run only while `{code_of(guard.test)}`"
                " holds, which each process computes from its own data: the processes could take"
                " different numbers of steps, and DDP would wait forever for the others; the"
                " processes cannot agree on it each time, as they do not all reach it as often"
                " (only an `if` in loops over `range()` can be); make the condition one every"
                " process computes alike (a step or episode count)",
                guard,
                wrong=True,
            )
            return
        for guard, _ in guards:
            self.agreed.add(guard.test)
            self.changed(
                guard,
                f"the training steps run only while `{code_of(guard.test)}` holds, which each process"
                f" computes from its own data: `{EVERY_PROCESS}()` all-reduces it, so that every process"
                " trains at the same time, once it holds on all of them",
            )
        if Generator.TORCH not in generators:
            self.skipped(
                "DistributedSampler",
                "this training loop draws new random batches every step from Python's or NumPy's"
                " generator, unseeded, so each process draws its own, which shards them; each draws"
                f" a batch of the original size, so the global batch is {WORLD_SIZE} times larger",
                loop,
            )
            return
        seeds = self.seed_calls(module)
        alike = not any(mentions_rank(a.value) for c in seeds for a in c.args)
        # a seed set again in every step, after the rank's re-seed, makes them draw alike too
        reseeded = any(
            loop in self.ancestors(c) and not any(mentions_rank(a.value) for a in c.args)
            for c in seeds
        )
        if seeds and alike or reseeded:
            self.skipped(
                "DistributedSampler",
                "this training loop draws new random batches every step, but every process"
                " seeds its generator alike and would draw the same ones; seed each process"
                f" with `seed + {RANK}` by hand",
                loop,
                wrong=True,
            )
            return
        if self._draw_offsets_per_process(loop):
            return
        self.skipped(
            "DistributedSampler",
            "this training loop draws new random batches every step, and each process"
            " draws its own from its own random stream, which shards them; each draws a"
            f" batch of the original size, so the global batch is {WORLD_SIZE} times larger",
            loop,
        )

    def _host_seeded_alike(self, module: cst.Module) -> bool:
        """Refuse, and say so, when `random.seed(0)` (or NumPy's) seeds every process alike
        and nothing re-seeds it by rank before training (SeedEachRank does where the
        training draws from it): they would all draw the same batches."""
        calls = [c for c in self.seed_calls(module, HOST_SEEDS) if c.args]
        by_rank = {
            name
            for call in calls
            if any(mentions_rank(a.value) for a in call.args)
            for name in self.qualified_names(call.func)
        }
        alike = [
            call for call in calls
            if not any(mentions_rank(a.value) for a in call.args)
            and not self.qualified_names(call.func) & by_rank
        ]  # fmt: skip
        if not alike:
            return False
        self.skipped(
            "DistributedSampler",
            "a training loop draws new random batches every step from Python's or NumPy's"
            " generator, and this seeds it alike on every process: all would draw the same"
            f" ones; seed it with `seed + {RANK}` by hand",
            alike[0],
            wrong=True,
        )
        return True

    def _uneven_guards(
        self, step: StepLoop
    ) -> list[tuple[cst.If | cst.While, FunctionInfo | None]]:
        """The `if`s and `while`s of this module around the training steps (around the
        loop, or around a call that runs it), innermost first, each with the function it is
        in, whose test reads what a loop around it changes: `if len(memory) > 64:` where
        the episode loop appends to `memory`. Each process computes it from its own data
        (its own environment, its own draws)."""
        program = self.script.program
        guards: dict[cst.If | cst.While, FunctionInfo | None] = {}
        for site, module in step_sites(step, self.script):
            if module is not self.script.module:
                continue
            function = program.function_of.get(site) if program is not None else step.function
            child = site
            for ancestor in self.ancestors(site):
                if isinstance(ancestor, _FUNCTIONS):
                    break
                if (
                    isinstance(ancestor, (cst.If, cst.While))
                    and child is not ancestor.test
                    and not agreed(ancestor.test)
                    and self._varies(ancestor.test, ancestor, module.index, function)
                ):
                    guards[ancestor] = function
                child = ancestor
        return list(guards.items())

    def _counted(self, guard: cst.CSTNode, function: FunctionInfo | None) -> bool:
        """Whether every process reaches `guard`, of this module, in `function` (None: at
        module level), as often: each loop around it, and around each call of its function
        wherever the program makes it, counts `range()` (which no loop around it changes)
        and leaves no round early."""
        return all(
            self._counts(*around) for around in self._around(guard, self.script.index, function)
        )

    def _counts(
        self, loop: cst.For | cst.While, index: ModuleIndex, function: FunctionInfo | None
    ) -> bool:
        """Whether `loop` runs as many rounds on every process: `for ... in range(n)`
        (or `tqdm(range(n))`), `n` changed by no loop around it, and no `break`,
        `continue` or `return` of its own."""
        if not isinstance(loop, cst.For) or batch_source(loop, index) is not None:
            return False
        if self._varies(loop.iter, loop, index, function):
            return False
        for leaving in find(loop.body, (cst.Break, cst.Continue, cst.Return)):
            # a `return` of a function defined in the loop, a `break` of a loop in it: not its own
            inner = (
                _FUNCTIONS if isinstance(leaving, cst.Return) else (*_FUNCTIONS, cst.For, cst.While)
            )
            if (
                next(a for a in index.ancestors(leaving) if a is loop or isinstance(a, inner))
                is loop
            ):
                return False
        return True

    def _around(
        self,
        node: cst.CSTNode,
        index: ModuleIndex,
        function: FunctionInfo | None,
        seen: frozenset = frozenset(),
    ) -> Iterator[tuple[cst.For | cst.While, ModuleIndex, FunctionInfo | None]]:
        """The loops around `node` (of the module `index` indexes) in `function` (None: at
        module level), innermost first, then those around each call of `function` in the
        program, and so on up; each with its module's index and its function."""
        for loop in index.ancestors(node):
            if isinstance(loop, _FUNCTIONS):
                break
            if isinstance(loop, (cst.For, cst.While)):
                yield loop, index, function
        program = self.script.program
        if function is None or program is None or function in seen:
            return
        for call in program.calls_of(function):
            caller = program.function_of.get(call)
            yield from self._around(call, program.module_of[call].index, caller, seen | {function})

    def _round_loop(self, step: StepLoop) -> tuple[cst.CSTNode, SourceModule] | None:
        """The training loop, or the call that runs it, inside a loop that does more than
        repeat it: a PPO agent's `agent.update()` inside its rollout loop."""
        for loop, site, module in rounds(step, self.script):
            calls = find(loop.body, cst.Call)
            if any(c is not site and step.node not in module.index.ancestors(c) for c in calls):
                return site, module
        return None

    def _varies(
        self,
        expression: cst.BaseExpression,
        place: cst.CSTNode,
        index: ModuleIndex,
        function: FunctionInfo | None,
    ) -> bool:
        """Whether `expression`, at `place` (of the module `index` indexes) in `function`,
        reads a name that a loop around it (see `_around`) binds or calls a method of
        (`memory.append(...)`); the counters of `range` loops are the same on every process."""
        read = {name_key(node) for node in find(expression, (cst.Name, cst.Attribute))}
        changed: set[str | None] = set()
        for loop, loop_index, _ in self._around(place, index, function):
            if batch_source(loop, loop_index) is not None:
                changed.update(bound_names(loop.target))  # type: ignore[union-attr]
            body = loop.body
            changed.update(n for t in find(body, cst.AssignTarget) for n in bound_names(t.target))
            changed.update(name_key(a.target) for a in find(body, (cst.AugAssign, cst.AnnAssign)))
            receivers = (
                c.func.value for c in find(body, cst.Call) if isinstance(c.func, cst.Attribute)
            )
            changed.update(name_key(receiver) for receiver in receivers)
            changed.update(n for f in find(body, cst.For) for n in bound_names(f.target))
        return bool(read & changed - {None})

    def _draw_offsets_per_process(self, loop: cst.CSTNode) -> bool:
        """nanoGPT's `get_batch()`: `ix = torch.randint(len(data) - block_size,
        (batch_size,))` draws offsets into a tensor of the data (`data[i:i + block_size]
        for i in ix`). Each process draws its own from its rank-seeded stream, which
        samples the data as a sampler with replacement would; like such a sampler, each
        draws `batch_size // WORLD_SIZE`, so the global batch stays."""
        step = self.script.step_loops[loop]
        bodies = [loop] + [
            f.node
            for f in step.reached
            if f.module is step.module and not (f.cls and f.cls.is_module)
        ]
        sizes = [
            size
            for body in bodies
            for call in find(body, cst.Call)
            if (size := self._offset_draw_size(body, call)) is not None
        ]
        if not sizes:
            return False
        for size in sizes:
            batch = size.value
            if isinstance(batch, cst.Call) and is_name(batch.func, BATCH_HELPER):
                continue  # converted already
            if not self.options.per_process_batch:
                self.draw_sizes[size] = f"{BATCH_HELPER}({code_of(batch)})"
                self.helper_needed = True
            self.changed(
                size,
                "each process draws its own offsets into the data from its own random stream"
                f" (re-seeded with its {RANK}, or unseeded), which shards it"
                + (
                    ""
                    if self.options.per_process_batch
                    else f"; per-process batch = global batch // {WORLD_SIZE}"
                ),
            )
        return True

    def _offset_draw_size(self, body: cst.CSTNode, call: cst.Call) -> cst.Element | None:
        """The batch element of `size` in `ix = torch.randint(high, (batch_size,))` when `ix`
        indexes a tensor in `body` (`data[ix]`, `data[i:i + n] for i in ix`)."""
        if (
            "torch.randint" not in self.qualified_names(call.func)
            or keyword_value(call, "generator") is not None
        ):
            return None
        size = keyword_value(call, "size")
        if size is None:
            size = next(
                (
                    a.value
                    for a in call.args
                    if a.keyword is None and isinstance(a.value, (cst.Tuple, cst.List))
                ),
                None,
            )
        assign = self.parent(call)
        if (
            not isinstance(size, (cst.Tuple, cst.List))
            or not size.elements
            or not isinstance(assign, cst.Assign)
        ):
            return None
        offsets = {name_key(t.target) for t in assign.targets}
        indexes = {
            name_key(name)
            for subscript in find(body, cst.Subscript)
            for element in subscript.slice
            for name in find(element.slice, cst.Name)
        }
        iterated = {
            name
            for comp in find(body, cst.CompFor)
            for name in bound_names(comp.target)
            if name_key(comp.iter) in offsets
        }
        return size.elements[0] if offsets & indexes or iterated & indexes else None

    def _alternative(self, call: cst.Call) -> str | None:
        """The name of the loader `call` makes under an `if` (Proxy-Anchor's `if args.IPC:`
        batch sampler), when the same name gets a loader without a sampler in another
        branch: which one trains is the run's to tell."""
        assign = self.parent(call)
        key = name_key(assign.targets[0].target) if isinstance(assign, cst.Assign) else None
        if key is None or not any(isinstance(a, cst.If) for a in self.ancestors(call)):
            return None
        for other in self.loader_calls:
            parent = self.parent(other)
            if (
                other is not call
                and isinstance(parent, cst.Assign)
                and name_key(parent.targets[0].target) == key
                and keyword_value(other, "sampler") is None
                and keyword_value(other, "batch_sampler") is None
            ):
                return key
        return None

    def _shard(self, call: cst.Call) -> None:
        if self.script.streams(call):
            self._split_stream(call)
            return
        sampler = keyword_value(call, "sampler")
        unset = self._none_assignment(call, sampler)
        if unset is not None:
            sampler = None  # `train_sampler = None`: no sampler
        if sampler is not None and self._weighted(sampler):
            self._share_draws(call, sampler)
            return
        if sampler is not None and self._draws_with_replacement(sampler):
            self._draw_independently(call)
            return
        if sampler is not None or keyword_value(call, "batch_sampler"):
            alternative = self._alternative(call)
            self.skipped(
                "DistributedSampler",
                "the training DataLoader already has a sampler; make it shard by rank by hand"
                + (
                    f" (it is made under a condition, `{alternative}` otherwise: where the proof"
                    f" runs before writing, its check that the {DIFFERENT_DATA} decides)"
                    if alternative
                    else ""
                ),
                call,
                wrong=True,
                proof=DIFFERENT_DATA if alternative else "",
            )
            return
        shuffle = keyword_value(call, "shuffle")
        if any(a.star == "**" for a in call.args) and shuffle is None:
            # (with `shuffle=` written out, the dict holds neither it nor a sampler)
            self._shard_through_kwargs(call)
            return
        statement = self.statement_of(call)
        target = self._keyed_name(call) or _assigned_name(statement) or _returned(statement, call)
        dataset = (
            call.args[0].value
            if call.args and call.args[0].keyword is None
            else keyword_value(call, "dataset")
        )
        if target is None or dataset is None:
            self.skipped(
                "DistributedSampler",
                "give the training DataLoader a DistributedSampler by hand",
                call,
                wrong=True,
            )
            return
        if unset is not None and not self._defined_before(dataset, unset, statement):
            self.skipped(
                "DistributedSampler",
                f"the training DataLoader's sampler is `{code_of(unset.body[0])}` (no sampler), but"
                " its dataset is not made before that line: make a DistributedSampler of the"
                " dataset in its place by hand",
                call,
                wrong=True,
            )
            return
        edits: dict[str, str] = {}
        if unset is None:
            sampler_name = self._fresh(_sibling_name(target, "sampler"))
            edits["sampler"] = sampler_name
        else:
            sampler_name = code_of(unset.body[0].targets[0].target)  # type: ignore[attr-defined]
        dataset_name = name_key(dataset)
        if dataset_name is None:
            dataset_name = self._fresh(_sibling_name(target, "dataset"))
            self.datasets[dataset] = dataset_name
            self.before.setdefault(statement, []).extend(
                parse_statements(f"{dataset_name} = {code_of(dataset)}\n")
            )
        if shuffle is None or m.matches(shuffle, m.Name("False")):
            shuffled = "False"
        elif m.matches(shuffle, _is_none(sampler_name)):  # `shuffle=(train_sampler is None)`
            shuffled = "True"
        else:
            shuffled = code_of(shuffle)
            edits["shuffle"] = (
                f"{sampler_name} is None"
                if shuffled == "True"
                else f"{shuffled} and {sampler_name} is None"
            )
        self._rewrite(call, edits)
        split = self.splits.get(call)
        if split is not None and "batch_size" in edits:  # the other splits keep their batch
            batch = code_of(keyword_value(call, "batch_size"))  # type: ignore[arg-type]
            edits["batch_size"] = (
                f"{edits['batch_size']} if {sampler_name} is not None else {batch}"
            )
        made = parse_statements(
            f"{sampler_name} = DistributedSampler({dataset_name}, shuffle={shuffled})"
            f" if {DISTRIBUTED}{'' if split is None else ' and ' + _selected(split)} else None\n"
        )
        if unset is None:
            self.before.setdefault(statement, []).extend(made)
        else:  # in place of `train_sampler = None`
            self.replace[unset] = [made[0].with_changes(leading_lines=unset.leading_lines)]
        self.imports.append(SAMPLER_IMPORT)
        self.changed(
            call,
            "training DataLoader reads its own shard through DistributedSampler"
            + ("" if shuffled == "False" else " (the shuffle moves into the sampler)")
            + (
                ""
                if split is None
                else f", made only where `{split.name}` is {code_of(split.value)}, as in the calls"
                f" the training loops read: `{split.function.name}()`'s other loaders stay whole"
            )
            + (
                f"; per-process batch = global batch // {WORLD_SIZE}"
                if "batch_size" in edits
                else ""
            ),
        )

    def _none_assignment(
        self, call: cst.Call, sampler: cst.BaseExpression | None
    ) -> cst.SimpleStatementLine | None:
        """`train_sampler = None`, in the block of the loader `call`, when it is the only
        value of its `sampler=train_sampler`."""
        if not isinstance(sampler, cst.Name):
            return None
        index = self.script.index
        assert index is not None
        values = reaching_values(sampler, self.scope_of(call) or self.tree, index)
        if len(values) != 1 or not is_name(values[0], "None"):
            return None
        statement = self.statement_of(values[0])
        plain = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name())])])
        same_block = self.parent(statement) is self.parent(self.statement_of(call))
        return statement if same_block and m.matches(statement, plain) else None  # type: ignore[return-value]

    def _defined_before(
        self, dataset: cst.BaseExpression, line: cst.BaseStatement, statement: cst.CSTNode
    ) -> bool:
        """Whether `dataset` is a name that no statement from `line` to the loader's
        `statement` (of one block) binds."""
        name = name_key(dataset)
        block = self.parent(statement)
        assert isinstance(block, cst.IndentedBlock | cst.Module)
        body: list[cst.CSTNode] = list(block.body)
        between = body[body.index(line) : body.index(statement)]
        return name is not None and not any(
            name in bound_names(t.target) for s in between for t in find(s, cst.AssignTarget)
        )

    def _split_stream(self, call: cst.Call) -> None:
        """An IterableDataset of the project, which no sampler can shard: the loader reads
        it through `ShardedStream`, which splits it by process and by DataLoader worker
        (so workers can be added); each process loads `batch_size // WORLD_SIZE`."""
        dataset = (
            call.args[0].value
            if call.args and call.args[0].keyword is None
            else keyword_value(call, "dataset")
        )
        assert dataset is not None  # `streams` found it
        if isinstance(dataset, cst.Call) and is_name(dataset.func, SHARDED_STREAM):
            return  # converted already
        if any(
            mentions_rank(obj.cls.node) or "get_worker_info" in names_in(obj.cls.node)
            for obj in self.script.values(dataset)
            if obj.cls is not None
        ):
            self.skipped(
                "DistributedSampler",
                "the training IterableDataset reads its process or worker itself; left as it is",
                call,
            )
            return
        self.streams.add(dataset)
        edits: dict[str, str] = {}
        self._rewrite(call, edits)
        self.changed(
            call,
            f"the training IterableDataset is split by process and by DataLoader worker (`{SHARDED_STREAM}`:"
            f" each reads every {WORLD_SIZE} x workers-th item, a last incomplete round left out)"
            + (f"; per-process batch = global batch // {WORLD_SIZE}" if edits else ""),
        )

    def _rewrite(self, call: cst.Call, edits: dict[str, str]) -> None:
        """Rewrite the loader `call` with `edits`, and with the per-process batch size
        unless `--per-process-batch` keeps the batch per process already."""
        batch = keyword_value(call, "batch_size")
        if batch is not None and not self.options.per_process_batch:
            edits["batch_size"] = f"{BATCH_HELPER}({code_of(batch)})"
            self.helper_needed = True
        self.calls[call] = edits

    def _weighted(self, sampler: cst.BaseExpression) -> bool:
        """Whether `sampler` is a `WeightedRandomSampler(...)`, or a name bound to one."""
        if isinstance(sampler, cst.Call):
            return bool(WEIGHTED_SAMPLERS & self.qualified_names(sampler.func))
        key = name_key(sampler)
        values = [
            assign.value
            for assign in find(self.tree, cst.Assign)
            if any(name_key(t.target) == key for t in assign.targets)
        ]
        return bool(values) and all(isinstance(v, cst.Call) and self._weighted(v) for v in values)

    def _draws_with_replacement(self, sampler: cst.BaseExpression) -> bool:
        """`RandomSampler(ds, replacement=True, ...)` on the global random stream (minGPT's
        trainer): independent draws, so each process drawing its own is a shard."""
        if (
            not isinstance(sampler, cst.Call)
            or not self.qualified_names(sampler.func) & RANDOM_SAMPLERS
        ):
            return False
        return (
            is_true(keyword_value(sampler, "replacement"))
            and keyword_value(sampler, "generator") is None
        )

    def _draw_independently(self, call: cst.Call) -> None:
        """Keep a sampler of independent draws: each process draws from its own stream
        (re-seeded with its rank), a batch of `batch_size // WORLD_SIZE`."""
        edits: dict[str, str] = {}
        batch = keyword_value(call, "batch_size")
        if isinstance(batch, cst.Call) and is_name(batch.func, BATCH_HELPER):
            return  # converted already
        self._rewrite(call, edits)
        self.changed(
            call,
            "the sampler draws with replacement from the global random stream: each process"
            " draws its own samples (its stream is seeded with its rank), which shards them"
            + (f"; per-process batch = global batch // {WORLD_SIZE}" if edits else ""),
        )

    def _share_draws(self, call: cst.Call, sampler: cst.BaseExpression) -> None:
        """A weighted sampler keeps its weights: each process reads its share of one draw."""
        statement = self.statement_of(call)
        name = name_key(sampler)
        if name is None:  # built in the call: named first
            name = self._fresh(_sibling_name(_assigned_name(statement) or "loader", "sampler"))
            self.before.setdefault(statement, []).extend(
                parse_statements(f"{name} = {code_of(sampler)}\n")
            )
        edits = {"sampler": f"{SHARED_DRAW}({name}) if {DISTRIBUTED} else {name}"}
        self._rewrite(call, edits)
        self.shared_draws_needed = True
        self.changed(
            call,
            f"the weighted sampler keeps its weights: every process draws the same indices and"
            f" reads every {WORLD_SIZE}-th (`{SHARED_DRAW}`)"
            + (
                f"; per-process batch = global batch // {WORLD_SIZE}"
                if "batch_size" in edits
                else ""
            ),
        )

    def _shard_through_kwargs(self, call: cst.Call) -> None:
        """Shard a loader whose keywords come from a `**dict`."""
        stars = [a for a in call.args if a.star == "**"]
        kwargs = name_key(stars[0].value) if len(stars) == 1 else None
        others = [
            c
            for c in self.script.loader_calls
            if c is not call and any(name_key(a.value) == kwargs for a in c.args if a.star == "**")
        ]
        dataset = call.args[0].value if call.args and call.args[0].keyword is None else None
        statement = self.statement_of(call)
        if kwargs is None or others or name_key(dataset) is None:
            self.skipped(
                "DistributedSampler",
                "the training DataLoader's keywords come from a shared or unknown `**dict`;"
                " give it a DistributedSampler (shuffle moved into it) by hand",
                call,
                wrong=True,
            )
            return
        code = (
            f"if {DISTRIBUTED}:\n"
            f'    {kwargs}["sampler"] = DistributedSampler(\n'
            f'        {name_key(dataset)}, shuffle={kwargs}.pop("shuffle", False)\n'
            "    )\n"
        )
        if not self.options.per_process_batch and not isinstance(
            self.script.keyword(call, "batch_size"), Missing
        ):
            code += f'    {kwargs}["batch_size"] = {BATCH_HELPER}({kwargs}["batch_size"])\n'
            self.helper_needed = True
        self.before.setdefault(statement, []).extend(parse_statements(code))
        self.imports.append(SAMPLER_IMPORT)
        self.changed(
            call,
            "training DataLoader reads its own shard through DistributedSampler (the shuffle"
            f" moves into the sampler); per-process batch = global batch // {WORLD_SIZE}",
        )

    def _fresh(self, name: str) -> str:
        """A new name for the script, reserved for the rest of this step."""
        chosen = fresh_name(name, self.bound)
        self.bound.add(chosen)
        return chosen

    def edited(self) -> list[cst.CSTNode]:
        arguments = [
            self.parent(dataset) for dataset in [*self.datasets, *self.streams]
        ]  # `leave_Arg`'s
        arguments += [self.parent(test) for test in self.agreed]  # `leave_If`'s
        return [*self.planned_statements(), *self.calls, *filter(None, arguments), *self.draw_sizes]

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if original_node.test not in self.agreed:
            return updated_node
        return updated_node.with_changes(
            test=cst.Call(cst.Name(EVERY_PROCESS), [cst.Arg(updated_node.test)])
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        for keyword, value in self.calls.get(original_node, {}).items():
            added = keyword_value(updated_node, keyword) is None
            updated_node = set_keyword(updated_node, keyword, value)
            if added:
                updated_node = _before_double_star(updated_node)
        return updated_node

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if original_node.value in self.streams:
            wrapped = cst.Call(cst.Name(SHARDED_STREAM), [cst.Arg(updated_node.value)])
            return updated_node.with_changes(value=wrapped)
        name = self.datasets.get(original_node.value)
        return updated_node if name is None else updated_node.with_changes(value=cst.Name(name))

    def leave_Element(self, original_node: cst.Element, updated_node: cst.Element) -> cst.Element:
        size = self.draw_sizes.get(original_node)
        return (
            updated_node
            if size is None
            else updated_node.with_changes(value=cst.parse_expression(size))
        )


def train_loader_calls(
    script: ScriptModel, unselected: Mapping[cst.Call, Flag] | None = None
) -> set[cst.Call]:
    """The DataLoader calls of `script`'s module that a training loop of any module of
    the program reads, but those of a helper's branch that no call a training loop reads
    selects (`unselected`: `unselected_loaders(script)`, made here when not given)."""
    if unselected is None:
        unselected = unselected_loaders(script)
    return {
        loader.node for loader in training_readers(script) if isinstance(loader.node, cst.Call)
    } - unselected.keys()


def _is_none(name: str) -> m.Comparison:
    """`name is None`."""
    return m.Comparison(
        left=m.Name(name), comparisons=[m.ComparisonTarget(m.Is(), comparator=m.Name("None"))]
    )


def _selected(split: Split) -> str:
    """`flag == "train"`, `train` or `not train`: where the factory makes the training loader."""
    if split.value.deep_equals(cst.Name("True")):
        return split.name
    if split.value.deep_equals(cst.Name("False")):
        return f"not {split.name}"
    return f"{split.name} == {code_of(split.value)}"


def _before_double_star(call: cst.Call) -> cst.Call:
    """Move the keyword just appended to `call` in front of its `**` argument, if any."""
    args = list(call.args)
    star = next((i for i, a in enumerate(args) if a.star == "**"), None)
    if star is None:
        return call
    new = args.pop()
    separator = args[-1].comma
    args[-1] = args[-1].with_changes(comma=new.comma, whitespace_after_arg=new.whitespace_after_arg)
    args.insert(
        star, new.with_changes(comma=separator, whitespace_after_arg=cst.SimpleWhitespace(""))
    )
    return call.with_changes(args=args)


def _assigned_name(statement: cst.CSTNode) -> str | None:
    if m.matches(statement, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget()])])):
        key = name_key(statement.body[0].targets[0].target)  # type: ignore[attr-defined]
        return key.removeprefix("self.") if key else None
    return None


def _returned(statement: cst.CSTNode, call: cst.Call) -> str | None:
    """`"loader"` for `return DataLoader(...)` (a loader made by a helper function)."""
    if m.matches(statement, m.SimpleStatementLine(body=[m.Return()])):
        return "loader" if statement.body[0].value is call else None  # type: ignore[attr-defined]
    return None


def _sibling_name(loader: str, kind: str) -> str:
    """`train_loader` -> `train_sampler`; `dataloader` -> `sampler`; `dl` -> `dl_sampler`."""
    for word in ("dataloader", "loader"):
        if word in loader:
            return loader.replace(word, kind)
    return f"{loader}_{kind}"
