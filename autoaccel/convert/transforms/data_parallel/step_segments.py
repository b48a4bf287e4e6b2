"""The general shape of `--to dp`: the lines of a training step from its forward pass to
its loss, moved into a function that each GPU runs on its part of the batch.

    out = self.model(x, lengths)[0]                def compute_loss(model, x, lengths, y):
    out = out.squeeze(1)                 ->            out = model(x, lengths)[0]
    loss = self.criterion(out, y)                      out = out.squeeze(1)
    loss.backward()                                    return self.criterion(out, y)
                                               loss_on_gpus = LossInForward(compute_loss, self.model)
                                               ...
                                               loss = loss_on_gpus(x, lengths, y).mean()

Every tensor `nn.DataParallel` receives is split along dimension 0, so the step's
inputs must be batch-first: names bound by the loop over the loader, computed from
them in the step, or made with the loader's `batch_size` (`torch.ones(batch_size, 1)`).
A recurrent state, a tensor made elsewhere, or one reshaped across the batch dimension
would be split wrongly: those steps are refused, naming the line. Where the code alone
cannot tell (`x.view(-1, k)` before `model(x)`, an element of the tuple a model returns
read after the step), the shapes a short run of the script recorded at the model's call
can (`autoaccel.facts.model.batch_first`): `convert` runs it for them (`RUN_CAN_TELL`).
Values that are not per-step tensors (`self.criterion`, `args.alpha`, `epoch`) are read
by the function from its scope. Each `.backward()` gets its own segment, so each model of
a GAN trains under its own wrapper; a model that no optimizer trains (a frozen teacher)
is not replicated: its outputs have no gradients to reduce, and it runs where it ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.batch_pairs import assigned, called_pairing, read
from autoaccel.analysis.fresh_data import generator_of
from autoaccel.analysis.index import ModuleIndex
from autoaccel.analysis.loss_reduction import averages_or_sums
from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import Kind
from autoaccel.analysis.script_model import LoopRole
from autoaccel.analysis.training import StepLoop
from autoaccel.analysis.shapes import find, is_method_call, is_name, is_no_grad_block, tuple_items
from autoaccel.cst_edit import code_of, first_line_of, keyword_value
from autoaccel.convert.transforms.data_parallel.prepared_inputs import Prepared, prepared_inputs
from autoaccel.convert.transforms.distributed._base import where
from autoaccel.convert.transforms.distributed.shard_stream_columns import batch_source
from autoaccel.facts.model import BatchFirst, batch_first
from autoaccel.facts.resolve import FactsResolver

# What a forward may get that `nn.DataParallel` passes to every GPU as it is, rightly.
_PASSED_AS_THEY_ARE = frozenset({"int", "float", "bool", "str", "NoneType"})
# In the reason of a refusal that a short run of the script can answer (`convert` runs it).
RUN_CAN_TELL = "a short run of the script can show whether it is batch-first"
# Builtins that make a Python number of Python numbers.
_NUMBER_CALLS = frozenset(
    f"builtins.{name}" for name in ("min", "max", "float", "int", "abs", "round")
)

# Methods and functions that mix the samples of a batch (or leave the GPU): a line of the
# forward pass that calls one is not per-sample, so it cannot run on a part of the batch.
_ACROSS_BATCH_METHODS = frozenset(
    {"mean", "sum", "std", "var", "norm", "max", "min", "prod", "logsumexp"}
)
_HOST_METHODS = frozenset({"item", "cpu", "numpy", "tolist"})
_ACROSS_BATCH_FUNCTIONS = frozenset({"torch.cat", "torch.stack", "torch.mean", "torch.sum"})
_FLATTENING = frozenset({"view", "reshape", "flatten"})
# Tensor factories whose first positional argument is the first size (or all of them).
_FACTORIES = frozenset(
    {"torch.ones", "torch.zeros", "torch.randn", "torch.rand", "torch.empty", "torch.full"}
)
# The mixed precision rewrite's block (and the user's own): `_plain` moves it whole.
_AUTOCAST = frozenset(
    {"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast"}
)
# Methods of Python's containers that change them in place.
_MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add"}
)
# Names a recurrent model's state goes by, for a step function's parameters (no loop to
# follow them in).
_STATE_NAMES = frozenset(
    {"hidden", "hx", "h0", "c0", "state", "states", "memory", "mems", "carry", "h", "c"}
)


@dataclass
class Segment:
    """One `.backward()`'s forward pass and loss, to run on every GPU."""

    block: cst.CSTNode  # the block holding the lines
    span: list[cst.BaseStatement]  # from the first forward line to the loss line
    chain: list[cst.SimpleStatementLine]  # the lines that move into the function
    before: list[cst.BaseStatement]  # lines of the span that stay, before the call
    after: list[cst.BaseStatement]  # lines of the span that stay, after the call
    anchor: cst.CSTNode  # the function and its wrapper are created before this statement
    modules: list[str]  # the models (and loss modules) replicated, as written
    params: list[str]  # the function's parameter for each of `modules`
    inputs: list[str]  # the batch-first tensors passed to the wrapper
    loss_name: str
    kept: list[tuple[str, bool]] = field(default_factory=list)  # (name, scalar) read later
    reduce: str = "mean"
    function_name: str = ""
    wrapper_name: str = ""
    # Where the function and its wrapper are built (see `ComputeLossInForward._place`):
    # by default both just before `anchor`; a step without a loop of its own gets its
    # function at the top level, before `function_anchor`, and a method's step its wrapper
    # in `__init__`, right after `wrapper_after` (where the models are assigned).
    function_anchor: cst.CSTNode | None = None
    wrapper_after: cst.CSTNode | None = None
    established: list[str] = field(default_factory=list)  # what the run showed batch-first
    frozen: list[str] = field(
        default_factory=list
    )  # models no optimizer trains, run before the call
    # inputs moved to the device (or made tensors) before the call, see `prepared_inputs`
    prepared: Prepared = field(default_factory=Prepared)


class Refused(Exception):
    """Why a step cannot move into a wrapper; `node`: the line to name."""

    def __init__(self, reason: str, node: cst.CSTNode | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.node = node


class SegmentFinder:
    """Finds the segment of one `.backward()` call; raises `Refused` with a reason."""

    def __init__(self, transform, backward: cst.Call) -> None:
        self.t = transform
        self.script = transform.script
        self.backward = backward
        self.facts: FactsResolver | None = transform.module_facts()
        self.established: list[str] = []

    # -- helpers --------------------------------------------------------------------
    def _statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        while not isinstance(self.t.parent(node), (cst.IndentedBlock, cst.Module)):
            node = self.t.parent(node)
        return node

    def _model_calls(self, node: cst.CSTNode) -> list[cst.Call]:
        return [c for c in find(node, cst.Call) if name_key(c.func) in self.models]

    def _trains(self, call: cst.Call) -> bool:
        if not self.script.optimizers and not self.script.trained:
            return True  # no optimizer in sight: nothing tells which model is frozen
        values = [o for o in self.script.values(call.func)]
        if values:
            return any(self.script.trains(o) for o in values)
        key = name_key(call.func)
        return key in self.script.trained or not self.script.trained

    def _gradient_free(self, call: cst.Call) -> bool:
        """A model call whose outputs carry no gradients: under `torch.no_grad()` (or
        `inference_mode()`), or of a model no optimizer trains."""
        return not self._trains(call) or any(
            is_no_grad_block(block, self.t.qualified_names) for block in self.t.ancestors(call)
        )

    def _frozen_only(self, statement: cst.CSTNode) -> bool:
        calls = self._model_calls(statement)
        return bool(calls) and not any(self._trains(c) for c in calls)

    # -- the search -----------------------------------------------------------------
    def find(self) -> Segment | None:
        self.models = set(self.script.models)
        statement, owner = self.loss_owner()
        if owner is None:
            raise Refused("the loss is not computed in the lines before `.backward()`", statement)
        block = self.t.parent(statement)
        statements = list(block.body)
        loss_names = read(self.backward.func.value)
        loss_name = sorted(assigned(owner) & loss_names)[0]
        last = statements.index(owner)
        self._check_pairing(statements[: last + 1])
        if is_autocast_block(self.t, owner) and not self._plain(owner):
            # the mixed precision rewrite's block (or the user's): it moves whole
            inner = next(line for line in _lines(owner) if not _plain_line(line))
            raise Refused(
                f"the lines from the forward pass to `{loss_name}` hold {_compound(inner)},"
                " which cannot move into a function with them",
                inner,
            )
        if not self._plain(owner) or isinstance(owner, cst.If):
            raise Refused(
                f"`{loss_name}` is computed in {_compound(owner)}, not by plain assignments that"
                " can move into a function",
                owner,
            )
        # the lines that compute the loss from a trained model's outputs, back to its call
        model_derived = self._model_derived(statements[: last + 1])
        needed = read(owner) | (assigned(owner) & read(owner))
        chain_idx = [last]
        producers: set[cst.CSTNode] = set()  # lines computing the chain's other inputs
        first = None if not self._model_calls(owner) else last
        for j in range(last - 1, -1, -1):
            s = statements[j]
            if self._barrier(s):
                break
            defs = assigned(s)
            if not defs & needed:
                continue
            if s in model_derived and self._plain(s) and not self._frozen_only(s):
                chain_idx.append(j)
                needed |= read(s)
                if self._model_calls(s):
                    first = j
            else:
                producers.add(s)
                needed = needed - defs | read(s)  # `z = z.to(device)` needs the `z` made above
        if first is None:
            self._no_forward_pass(
                owner,
                loss_name,
                [s for s in statements[:last] if s in producers],
                model_derived,
                needed,
            )
        chain_idx = sorted(i for i in chain_idx if i >= first)
        span = statements[first : last + 1]
        chain = [statements[i] for i in chain_idx]
        for s in chain:
            if not self._plain(s):
                raise Refused("a line of the forward pass is not a plain assignment", s)
        defined_in_chain: set[str] = set()
        for s in chain:
            defined_in_chain |= assigned(s)
        before, after, pulled = [], [], []
        for index, s in enumerate(span):
            if s in chain:
                continue
            reads_chain = bool(read(s) & defined_in_chain)
            # `label.fill_(0.0)` between two forward lines changes what the later ones
            # read (or a line feeding them changes `x` in place): it runs before the call,
            # so it must not change what earlier ones read
            changed = self._changed_in_place(s)
            read_before = {n for c in span[:index] if c in chain for n in read(c)}
            read_after = {n for c in span[index + 1 :] if c in chain for n in read(c)}
            feeds_chain = s in producers or bool(changed & read_after)
            if changed & read_before and feeds_chain:
                raise Refused(
                    f"`{min(changed & read_before)}` is changed in place between two lines of"
                    " the forward pass, after one that reads it",
                    s,
                )
            # `real_score = outputs` before `outputs = D(fake_images)`: after the call it
            # would read the last value, so a plain assignment moves in with the chain
            rebound = read(s) & {n for c in span[index + 1 :] if c in chain for n in assigned(c)}
            if feeds_chain and not reads_chain:
                before.append(s)  # e.g. the frozen teacher's outputs under no_grad
            elif not feeds_chain and not rebound:
                after.append(s)  # a timer, a print: not per-sample, stays outside
            elif not feeds_chain and m.matches(s, m.SimpleStatementLine(body=[m.Assign()])):
                pulled.append(s)
            elif not feeds_chain:
                raise Refused(
                    f"`{min(rebound)}` is read between two lines of the forward pass that bind it",
                    s,
                )
            else:
                raise Refused(
                    "a line between the forward pass and the loss both reads and feeds them", s
                )
        if pulled:
            chain = [s for s in span if s in chain or s in pulled]
            for s in pulled:
                defined_in_chain |= assigned(s)
        self._keep_draws_in_order(span, [*before, *chain, *after])
        self._chain_tensors = defined_in_chain
        lines = [line for s in chain for line in _lines(s)]  # an autocast block's, one by one
        loss_line = next(line for line in reversed(_lines(owner)) if loss_name in assigned(line))
        models, scalars = self._models_and_scalars(lines, loss_name, loss_line)
        for s in lines:
            # a whole-batch reduction is what a loss term is (`kl = -0.5 * torch.sum(...)`);
            # `_reduce` checks that the per-GPU terms add up
            self._check_per_sample(
                s, s is loss_line or bool(assigned(s)) and assigned(s) <= scalars
            )
            self._check_shared_state(s)
        in_order = [part for s in chain for part in _in_reading_order(s)]
        inputs = self._inputs(
            in_order, [*self._enclosing_before(statement), *statements[:first], *before], models
        )
        if not inputs:
            raise Refused(
                "the forward pass reads no tensor of the step's batch (the same tensors every"
                " step: full-batch training): `nn.DataParallel` would have nothing to split",
                chain[0],
            )
        prepared, unsplit = prepared_inputs(
            lines, inputs, defined_in_chain, self.t.parent, self.t.qualified_names
        )
        if unsplit is not None:
            raise Refused(
                f"`{unsplit}` is made a tensor in the forward pass, and read there otherwise"
                " too: a NumPy array (or list), which `nn.DataParallel` would hand whole to"
                " every GPU (it splits tensors only)",
                chain[0],
            )
        tested = next(
            (
                s
                for s in chain
                if isinstance(s, cst.If) and _tests(s) & {*inputs, *defined_in_chain}
            ),
            None,
        )
        if tested is not None:
            raise Refused(
                f"the `if` around the forward pass tests `{min(_tests(tested) & {*inputs, *defined_in_chain})}`,"
                " a tensor of the step: each GPU would test its own part of the batch",
                tested,
            )
        kept = self._kept(lines, defined_in_chain, scalars, loss_name)
        reduce = self._reduce(lines, loss_name, loss_line)
        attribute = step_attribute_set(self.t, [c for s in chain for c in self._model_calls(s)])
        if attribute is not None:
            raise attribute
        self._check_forward_attributes(chain)
        anchor = self._anchor(statement, span[0])
        params = self._params(models, inputs)
        return Segment(
            block=block,
            span=span,
            chain=chain,
            before=before,
            after=after,
            anchor=anchor,
            modules=models,
            params=params,
            inputs=inputs,
            loss_name=loss_name,
            kept=kept,
            reduce=reduce,
            established=self.established,
            prepared=prepared,
            frozen=list(
                dict.fromkeys(
                    code_of(c.func)
                    for s in before
                    for c in self._model_calls(s)
                    if self._gradient_free(c)
                )
            ),
        )

    def _keep_draws_in_order(self, span: list, moved: list) -> None:
        """Refuse where the lines of the step, as the rewrite orders them (`moved`: those
        before the call, the function's, those after), would draw random numbers in
        another order than `span` did: the same algorithm, but no longer the same values
        on one GPU (Popular-RL's TD3: the policy's and the target policy's noise swapped)."""
        drawing = [s for s in span if self._draws_random(s)]
        reordered = [s for s in moved if s in drawing]
        for original, now in zip(drawing, reordered):
            if original is not now:
                raise Refused(
                    f"`{first_line_of(now)}` and `{first_line_of(original)}` both draw random"
                    " numbers, and moving the forward pass into a function would swap the order"
                    " of their draws: the results would differ from the original's",
                    now,
                )

    def _draws_random(self, statement: cst.CSTNode) -> bool:
        """Whether `statement` draws from a global random generator, itself or in the
        functions of the project it runs (a policy's `normal.sample()`)."""
        calls = find(statement, cst.Call)
        program = self.script.program
        index = self.script.index
        places: list[tuple[cst.CSTNode, ModuleIndex]] = [(statement, index)]
        if program is not None:
            places += [(f.node, f.module.index) for f in program.reached_by(calls)]
        return any(
            generator_of(call, where) is not None or is_method_call(call, "sample", "rsample")
            for node, where in places
            for call in find(node, cst.Call)
        )

    def _check_pairing(self, statements: list[cst.CSTNode]) -> None:
        """A loss of the project that pairs samples of the batch (an online triplet loss:
        `embeddings[triplets[:, 0]]`) would pair those of each GPU's part only; refused,
        naming the line calling it (the lines since the step's last backward or update)."""
        lines = []
        for s in reversed(statements):
            if self._barrier(s):
                break
            lines.append(s)
        for s in reversed(lines):
            for call in find(s, cst.Call):
                found = called_pairing(call, self.script.values(call.func))
                if found is not None:
                    raise Refused(
                        f"`{code_of(call.func)}(...)` pairs samples across the batch (`{found[0]}`"
                        f" {found[1]}): on each GPU it would pair only those of its part of"
                        " the batch, so `nn.DataParallel` would change the loss",
                        self._statement_of(call),
                    )

    def loss_owner(self) -> tuple[cst.CSTNode, cst.CSTNode | None]:
        """The line computing the loss that the `.backward()` reads, in the block of its
        statement or, out of the blocks holding it in the step, before them (`loss =
        criterion(out, y)` above `if use_amp: scaler.scale(loss).backward() else:
        loss.backward()`); with the statement of the block that line is in. (The
        `.backward()`'s statement and None where no line before it computes the loss.)"""
        loss_names = read(self.backward.func.value)  # `loss`, `scaler.scale(loss)`
        statement = first = self._statement_of(self.backward)
        while True:
            block = self.t.parent(statement)
            body = list(block.body)
            before = body[: body.index(statement)]
            owner = next((s for s in reversed(before) if assigned(s) & loss_names), None)
            if owner is not None:
                return statement, owner
            outer = None if isinstance(block, cst.Module) else self._statement_of(block)
            if outer is None or isinstance(outer, (cst.For, cst.While, cst.FunctionDef)):
                return first, None
            statement = outer

    def _no_forward_pass(
        self, owner, loss_name: str, producers: list, model_derived: set, needed: set[str]
    ) -> None:
        """Why no line before the loss is a trained model's forward pass that can move;
        `needed`: the names the loss reads that no line of its block binds."""
        compound = next((s for s in producers if s in model_derived and not self._plain(s)), None)
        if compound is not None:
            raise Refused(
                f"the forward pass is in {_compound(compound)}, not in plain assignments that"
                " can move into a function",
                compound,
            )
        if self._model_calls(owner) or model_derived:
            raise Refused("only models that no optimizer trains are called for this loss", owner)
        unknown = next(
            (c for s in [*producers, owner] for c in find(s, cst.Call) if self._maybe_a_model(c)),
            None,
        )
        if unknown is not None:
            raise Refused(
                f"`{code_of(unknown.func)}(...)` computes `{loss_name}`, but the code does not show"
                " it to be a model: a helper computing the forward pass, or a model whose class"
                " is not visible where it is made",
                owner,
            )
        forward = next(
            (
                (s, c)
                for s in reversed(self._enclosing_before(owner))
                if assigned(s) & needed
                for c in find(s, cst.Call)
                if self._maybe_a_model(c)
            ),
            None,
        )
        if forward is not None:
            line, call = forward
            raise Refused(
                f"`{loss_name}` is computed in"
                f" {_compound(self._statement_of(self.t.parent(owner)))} from"
                f" `{min(assigned(line) & needed)}`, which `{code_of(call)}` computes before that"
                " block: the lines from the forward pass to the loss must be in one block to"
                " move into a function",
                owner,
            )
        raise Refused(
            "no model is called in the lines before `.backward()` (the forward pass"
            " is computed in a helper)",
            owner,
        )

    def _maybe_a_model(self, call: cst.Call) -> bool:
        """`self.model(x)`, `net(x)`: a call of an object of the script, not of torch's."""
        if not m.matches(call.func, m.Name() | m.Attribute(value=m.Name("self"))):
            return False
        if name_key(call.func) in self.script.criteria:
            return False
        qualified = self.t.qualified_names(call.func)
        return not any(q.startswith(("torch.", "builtins.")) for q in qualified)

    def _plain(self, s: cst.CSTNode) -> bool:
        """`y = f(x)`: one assignment; or an autocast block of such lines (the mixed
        precision rewrite's `with torch.autocast(...): out = model(x)`), which moves into
        the function as it is: each GPU's thread then runs it under autocast; or an `if`
        whose every branch (an `else` too) binds the same names by such lines
        (`if args.conditional: out = vae(x, y) else: out = vae(x)`), which moves whole."""
        if isinstance(s, cst.With):
            return is_autocast_block(self.t, s) and all(_plain_line(line) for line in _lines(s))
        if isinstance(s, cst.If):
            branches = _branches(s)
            return (
                branches[-1] is not None
                and all(
                    isinstance(b, cst.IndentedBlock) and all(map(_plain_line, b.body))
                    for b in branches
                )
                and len({frozenset(assigned(b)) for b in branches}) == 1
            )
        return _plain_line(s)

    def _enclosing_before(self, statement: cst.CSTNode) -> list[cst.CSTNode]:
        """The step's lines before the block holding `statement`, outermost first: a
        step under `if i % n_critic == 0:` reads the `z` bound above the `if`."""
        found: list[cst.CSTNode] = []
        node = self.t.parent(statement)
        while node is not None and not isinstance(
            node, (cst.For, cst.While, cst.FunctionDef, cst.Module)
        ):
            parent = self.t.parent(node)
            if isinstance(parent, cst.IndentedBlock) and isinstance(node, cst.BaseStatement):
                body = list(parent.body)
                found[:0] = body[: body.index(node)]
            node = parent
        return found

    def _changed_in_place(self, statement: cst.CSTNode) -> set[str]:
        """Names of the step a statement changes in place: a tensor's in-place method
        (`label.fill_(0.0)`, `x.requires_grad_()`) or a container's (`outs.append(o)`).
        `x.size(0)` changes nothing, nor is a module (`torch.rand(n)`) a value of the step."""
        changed = set()
        for call in find(statement, cst.Call):
            method = call.func
            if (
                isinstance(method, cst.Attribute)
                and isinstance(method.value, cst.Name)
                and _in_place(method.attr.value)
                and not self.t.qualified_names(method.value)
            ):
                changed.add(method.value.value)
        return changed

    def _barrier(self, s: cst.CSTNode) -> bool:
        """A line the segment cannot reach over: another step's backward or update. A
        `zero_grad()` is none: between the forward pass and the loss it changes neither."""
        return any(
            isinstance(c.func, cst.Attribute) and c.func.attr.value in ("backward", "step")
            for c in find(s, cst.Call)
        )

    def _model_derived(self, statements: list[cst.CSTNode]) -> set[cst.CSTNode]:
        """The lines that call a model or read what such a line computed."""
        derived_names: set[str] = set()
        lines = set()
        for s in statements:
            if self._model_calls(s) or read(s) & derived_names:
                lines.add(s)
                derived_names |= assigned(s)
        return lines

    def _check_per_sample(self, s: cst.SimpleStatementLine, is_loss: bool) -> None:
        for call in find(s, cst.Call):
            func = call.func
            if isinstance(func, cst.Attribute):
                name = func.attr.value
                if name in _HOST_METHODS:
                    raise Refused(
                        f"`.{name}()` in the forward pass leaves the GPU (not per-sample)", s
                    )
                if name in _ACROSS_BATCH_METHODS and not is_loss and self._across_dim0(call):
                    raise Refused(
                        f"`.{name}(...)` mixes the samples of the batch (not per-sample)", s
                    )
            if (
                self.t.qualified_names(func) & _ACROSS_BATCH_FUNCTIONS
                and not is_loss
                and not _along_a_later_dim(call)
            ):
                raise Refused(
                    f"`{code_of(func)}(...)` mixes the samples of the batch (not per-sample)", s
                )
            if isinstance(func, cst.Name) and func.value == "print":
                raise Refused("a print inside the forward pass", s)

    @staticmethod
    def _across_dim0(call: cst.Call) -> bool:
        dims = [a.value for a in call.args if a.keyword is None or a.keyword.value == "dim"]
        if not dims:
            return True
        return isinstance(dims[0], cst.Integer) and dims[0].value == "0"

    def _models_and_scalars(self, chain, loss_name, owner) -> tuple[list[str], set[str]]:
        models: list[str] = []
        for s in chain:
            for call in self._model_calls(s):
                text = code_of(call.func)
                if text not in models:
                    models.append(text)
            for node in find(s, (cst.Name, cst.Attribute)):
                key = name_key(node)
                if (
                    key in self.script.criteria
                    and key not in models
                    and self._is_module_criterion(node)
                ):
                    models.append(key)
        scalars: set[str] = set()
        for s in chain:
            value = s.body[0].value
            if self._scalar(value, scalars):
                scalars |= assigned(s)
        if not self._scalar(owner.body[0].value, scalars) and not self._model_calls(owner):
            raise Refused(
                f"`{loss_name}` is not computed by a loss function autoaccel knows (whether it"
                " averages the batch decides how the per-GPU losses combine)",
                owner,
            )
        return models, scalars

    def _is_module_criterion(self, node: cst.CSTNode) -> bool:
        parent = self.t.parent(node)
        return isinstance(parent, cst.Call) and parent.func is node

    def _scalar(self, expr: cst.BaseExpression, scalars: set[str]) -> bool:
        if isinstance(expr, cst.Call):
            return self._call_reduction(expr) is not None or self._loss_function(expr) is not None
        if isinstance(expr, cst.BinaryOperation):
            sides = (expr.left, expr.right)
            return any(self._scalar(x, scalars) for x in sides) and all(
                self._scalar(x, scalars) or not (read(x) & self._chain_tensors) for x in sides
            )
        if isinstance(expr, cst.UnaryOperation):
            return self._scalar(expr.expression, scalars)
        if isinstance(expr, cst.Name):
            return expr.value in scalars
        return False

    _chain_tensors: set[str] = set()

    def _inputs(self, chain, before_chain, replicated) -> list[str]:
        """The batch-first tensors the chain reads, in order; refused when one is not.
        The replicated modules are passed to the function apart (a step function's
        `net` and `criterion` parameters are not batch)."""
        defined: set[str] = set()
        wanted: list[str] = []
        for s in chain:
            for name in sorted(read(s) - defined, key=lambda n: code_of(s).find(n)):
                if name not in wanted:
                    wanted.append(name)
            defined |= assigned(s)
        loop = self._step_loop()
        step_names, batch, flattened, sizes, lines = self._step_names(loop, before_chain)
        moved = self._moved(before_chain)
        models = {m.split(".")[0] for m in self.models}
        inputs = []
        outside: list[str] = []  # tensors made before the step (full-batch training: none split)
        for name in wanted:
            if name in replicated or (name in models and name not in batch):
                continue
            line = lines.get(name, chain[0])
            if name in _STATE_NAMES and line is loop:  # a step function's parameter
                raise Refused(
                    f"`{name}` looks like a recurrent state: `nn.DataParallel` would split it"
                    " along dimension 0",
                    line,
                )
            if name in batch:
                inputs.append(name)
                self._refuse_objects(chain, name, line)
                if displays_a_container(line, name):
                    self._by_the_run(
                        name,
                        f"`{name}` is a tuple (or list) made in the step: `nn.DataParallel` splits"
                        " every tensor it holds along dimension 0, and not each is known to be"
                        " batch-first (a graph's `edge_index`, of shape (2, E), is not)",
                        line,
                        self._model_arguments(chain, name),
                        held_batch_first,
                    )
                elif name not in flattened and _no_loader(loop, self.script):
                    self._by_the_run(
                        name,
                        f"`{name}` comes from batches no torch DataLoader makes: whether its"
                        " dimension 0 is the batch is not known (torchtext's iterators, and"
                        " language models' `get_batch`, make sequence-first `[len, batch]`"
                        " tensors), and `nn.DataParallel` splits along dimension 0",
                        line,
                        self._model_arguments(chain, name),
                        FactsResolver.argument_batch_first,
                    )
                elif name not in flattened:  # (for a flattened one, the code claims nothing)
                    self._agrees_with_run(name, chain, line)
            elif name in defined or defined_in_loop_after(chain, name):
                raise Refused(
                    f"`{name}` is fed back into the model from one step to the next (a recurrent"
                    " state): `nn.DataParallel` would split it along dimension 0",
                    lines.get(name, chain[0]),
                )
            elif name in sizes:
                raise Refused(
                    f"`{name}` is the size of the whole batch: `nn.DataParallel` would pass that"
                    " same number to every GPU, which gets only a part of the batch",
                    lines[name],
                )
            elif name in step_names and self._reduces_batch(lines[name]):
                raise Refused(
                    f"`{name}` is one value for the whole batch (a loss or a reduction), computed"
                    " before this forward pass: `nn.DataParallel` splits every tensor it gets"
                    " along dimension 0, and this one has no batch dimension to split",
                    lines[name],
                )
            elif name in step_names and self._mixes_batch(lines[name]):
                raise Refused(
                    f"`{name}` is computed across the samples of the batch, so it is not"
                    " batch-first: `nn.DataParallel` would split it along dimension 0",
                    lines[name],
                )
            elif name in step_names and self._host_number(name, before_chain, batch):
                continue  # a Python number (`anneal = min(cap, step / total)`): not split
            elif name in step_names:
                raise Refused(
                    f"`{name}` is made in the step but not from the batch, so it is not known to"
                    " be batch-first: `nn.DataParallel` would split it along dimension 0",
                    lines.get(name, chain[0]),
                )
            elif self._tensor_made_outside(name):
                outside.append(name)
            if name in flattened:
                self._by_the_run(
                    name,
                    f"`{name}` is reshaped with `-1` first before the forward pass, which may"
                    " merge the batch dimension with another (`.view(x.size(0), -1)` keeps it):"
                    " `nn.DataParallel` would then split it unlike the other inputs",
                    line,
                    self._model_arguments(
                        chain, name
                    ),  # the run saw it where a model got it as it is
                    FactsResolver.argument_batch_first,
                )
        if inputs and outside:
            raise Refused(
                f"`{outside[0]}` is a tensor made outside the step, sized for the whole batch on"
                " one device: every GPU would read that same tensor with only its part of the"
                " batch; make it in the step from the batch (`torch.ones(x.size(0))`)",
                next(s for s in chain if outside[0] in read(s)),
            )
        on_host = [n for n in inputs if n in batch and n not in moved]
        if on_host and len(on_host) < len([n for n in inputs if n in batch]):
            name = on_host[0]
            raise Refused(
                f"`{name}` stays on the CPU where the other inputs move to the device (lengths"
                " for `pack_padded_sequence` must); `nn.DataParallel` would move it to every GPU",
                lines.get(name, chain[0]),
            )
        return inputs

    def _refuse_objects(self, chain, name: str, line: cst.CSTNode) -> None:
        """Refuse `name` where a model of the chain gets an object of a class of the
        project (gcn's `Data`): `nn.DataParallel` splits tensors and tuples, lists and
        dicts of them, and hands any other object to every GPU as it is."""
        for call, index in self._model_arguments(chain, name):
            if index is None:
                continue
            argument = [a for a in call.args if a.keyword is None][index].value
            classes = sorted(
                o.cls.name
                for o in self.script.values(argument)
                if o.kind is Kind.INSTANCE and o.cls is not None and not o.cls.is_module
            )
            seen = self.facts.forwards_at(call) if self.facts is not None else []
            kinds = sorted(
                {
                    held
                    for f in seen
                    for s in f.seen
                    if index < len(s.args)
                    and isinstance(held := s.args[index], str)
                    and held not in _PASSED_AS_THEY_ARE
                }
            )
            what = classes or kinds
            if what:
                raise Refused(
                    f"`{name}` is an object of the class `{what[0]}`, which `nn.DataParallel`"
                    " does not split: it hands every GPU the same object, with its tensors on the"
                    " first; pass the model its tensors (or tuples, lists, dicts of them)",
                    line,
                )

    def _model_arguments(self, chain, name: str) -> list[tuple[cst.Call, int | None]]:
        """The model calls of the chain that get `name` as it is, and its position."""
        places = []
        for s in chain:
            for call in self._model_calls(s):
                positional = [a for a in call.args if a.keyword is None]
                for index, arg in enumerate(positional):
                    if arg.star:
                        break  # `model(*xs, x)`: the positions the run saw are not these
                    if m.matches(arg.value, m.Name(name)):
                        places.append((call, index))
        return places

    def _agrees_with_run(self, name: str, chain, line: cst.CSTNode) -> None:
        """`name`, which the step reads from the batch, is refused where the run showed a
        model getting it with a dimension 0 other than the step's samples: the code and
        the run disagree."""
        if self.facts is None:
            return
        for call, index in self._model_arguments(chain, name):
            shown = held_batch_first(self.facts, call, index)
            if shown.known is False:
                raise Refused(
                    f"`{name}` comes from the batch, so the code takes it as batch-first, but the"
                    f" run shows `{code_of(call)}` getting it with {shown.why}: `nn.DataParallel`"
                    " would split it along dimension 0 unlike the batch",
                    line,
                )

    def _by_the_run(
        self,
        name: str,
        reason: str,
        line: cst.CSTNode,
        places: list[tuple[cst.Call, int | None]],
        ask: Callable[[FactsResolver, cst.Call, int], BatchFirst],
    ) -> None:
        """Accept `name`, which the code alone does not show batch-first (`reason`), where
        the run showed it batch-first (`ask`: an argument's or an output's shapes) at each
        of the model calls `places` (with its position there); refused otherwise, and
        without a run where none could tell (no place, or a position not plain to see)."""
        if not places or any(index is None for _, index in places):
            raise Refused(reason, line)
        if self.facts is None:
            raise Refused(f"{reason} ({RUN_CAN_TELL})", line)
        # a branch the run did not take (`else: out = vae(x)`) is taken as the same model's
        # calls the run made show it, at the same place of what it gets or returns
        ran = [(call, index) for call, index in places if self.facts.forwards_at(call)]
        shown = {(name_key(call.func), index) for call, index in ran}
        untaken = [
            call
            for call, index in places
            if (call, index) not in ran and (name_key(call.func), index) in shown
        ]
        found = [
            ask(self.facts, call, index) for call, index in places if call not in untaken  # type: ignore[arg-type]
        ]
        unsettled = next((v for v in found if not v.known), None)
        if unsettled is not None:
            raise Refused(f"{reason}; the run does not show it batch-first: {unsettled.why}", line)
        self.established.append(
            f"`{name}`: {found[0].why}"
            + "".join(
                f" (the run did not reach `{code_of(call)}`: taken as the same model's calls it made)"
                for call in untaken
            )
        )

    def _tensor_made_outside(self, name: str) -> bool:
        """Every binding of `name` in the script makes a tensor (`ones = torch.ones(n)`,
        `target = Tensor(n).fill_(1.0)`): read by a step that does not bind it."""
        values = [
            s.body[0].value  # type: ignore[attr-defined]
            for s in find(self.t.tree, cst.SimpleStatementLine)
            if name in assigned(s) and m.matches(s, m.SimpleStatementLine(body=[m.Assign()]))
        ]
        return bool(values) and all(self._makes_a_tensor(v) for v in values)

    def _makes_a_tensor(self, value: cst.BaseExpression | None) -> bool:
        """`torch.ones(n).to(device)`, `Tensor(n).fill_(1.0)` with `Tensor` a tensor type."""
        while isinstance(value, cst.Call):
            if self.t.qualified_names(value.func) & (_FACTORIES | {"torch.tensor"}) or (
                self.script.program is not None
                and any(
                    o.kind is Kind.TENSOR_TYPE
                    for o in self.script.program.values_of(value.func, self.script.module)
                )
            ):
                return True
            if "torch.autograd.Variable" in self.t.qualified_names(value.func) and value.args:
                value = value.args[0].value
            else:
                value = value.func.value if isinstance(value.func, cst.Attribute) else None
        return False

    def _check_shared_state(self, s: cst.CSTNode) -> None:
        """`pool.query(fake)` with `pool` an object of the project: under `nn.DataParallel`
        every GPU's thread would call the one object, whose state would mix them."""
        if self.script.program is None:
            return
        for call in find(s, cst.Call):
            if not isinstance(call.func, cst.Attribute):
                continue
            owners = self.script.program.values_of(call.func.value, self.script.module)
            called = self.script.program.values_of(call.func, self.script.module)
            if (
                owners
                and all(o.kind is Kind.INSTANCE for o in owners)
                and not any(o.kind in (Kind.MODULE, Kind.CRITERION) for o in called)
            ):
                raise Refused(
                    f"`{code_of(call.func)}(...)` calls an object of the project, which keeps"
                    " state: under `nn.DataParallel` every GPU would call that one object at"
                    " once with its part of the batch, mixing them in its state",
                    s,
                )

    def _step_loop(self):
        for ancestor in self.t.ancestors(self.backward):
            loop = self.script.step_loops.get(ancestor)
            if loop is not None:
                return loop
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return ancestor if isinstance(ancestor, cst.FunctionDef) else None
        return None

    def _step_names(self, loop, before_chain):
        """Names bound each step, those computed from the batch, those reshaped across
        it, the batch's sizes (`n = x.size(0)`), and the line binding each."""
        step_names: set[str] = set()
        batch: set[str] = set()
        flattened: set[str] = set()
        sizes: set[str] = set()
        lines: dict[str, cst.CSTNode] = {}
        if isinstance(loop, cst.FunctionDef):  # a step function: its parameters
            params = [p.name.value for p in loop.params.params if p.name.value != "self"]
            for p in params:
                step_names.add(p)
                lines[p] = loop
                batch.add(p)
            body = before_chain
        elif loop is not None:
            batch |= set(loop.batch_names)
            step_names |= set(loop.batch_names)
            target = loop.node.target if isinstance(loop.node, cst.For) else None
            if (
                isinstance(target, cst.Tuple)
                and isinstance(loop.node.iter, cst.Call)
                and is_enumerate(loop.node.iter)
                and target.elements
            ):
                index = target.elements[0].value
                if isinstance(index, cst.Name):
                    batch.discard(index.value)  # the step counter: a number, not split
            body = before_chain
        else:
            body = before_chain
        in_a_loop = loop is not None and not isinstance(loop, cst.FunctionDef)
        for line in body:
            for s in _statements_of(line):
                defs = assigned(s)
                step_names |= defs
                for name in defs:
                    lines[name] = line
                reads = read(s)
                if reads & flattened or reads & batch and self._flattens(s):
                    flattened |= defs
                else:
                    flattened -= defs  # bound anew, from what was not flattened
                sizes -= defs
                if reads & batch and self._batch_size(s):
                    sizes |= defs
                    batch -= defs
                elif (
                    reads & batch
                    and not self._reduces_batch(s)
                    and not self._mixes_batch(s)
                    or self._sized_by(s, sizes)
                    or self._draws_a_batch(s)
                    or self._stacks_samples(s)
                    or in_a_loop
                    and self._batch_sized(s, loop)
                ):
                    batch |= defs
                else:
                    batch -= defs
        return step_names, batch, flattened, sizes, lines

    def _host_number(
        self, name: str, lines: list, batch: set[str], seen: frozenset[str] = frozenset()
    ) -> bool:
        """Whether every line of the step that binds `name` binds it to a Python number:
        numbers, names and attributes that are not the step's tensors, arithmetic, and
        `min`/`max`/`float`/`int`/`abs`/`round` of those (vae-cf's KL weight, `anneal =
        min(args.anneal_cap, 1. * update_count / args.total_anneal_steps)`).
        `nn.DataParallel` hands such a value to every GPU as it is."""
        values = [
            assign.value
            for line in lines
            for assign in find(line, cst.Assign)
            if any(is_name(t.target, name) for t in assign.targets)
        ]
        bound = {n for line in lines for n in assigned(line)}

        def number(node: cst.BaseExpression) -> bool:
            if isinstance(node, (cst.Integer, cst.Float)):
                return True
            if isinstance(node, cst.UnaryOperation):
                return number(node.expression)
            if isinstance(node, cst.BinaryOperation):
                return number(node.left) and number(node.right)
            if isinstance(node, cst.Name):
                if node.value in batch or node.value in seen:
                    return False
                return node.value not in bound or self._host_number(
                    node.value, lines, batch, seen | {name}
                )
            if isinstance(node, cst.Attribute):
                root = node
                while isinstance(root, cst.Attribute):
                    root = root.value  # type: ignore[assignment]
                return isinstance(root, cst.Name) and root.value not in bound | batch
            if isinstance(node, cst.Call) and self.t.qualified_names(node.func) & _NUMBER_CALLS:
                return all(a.keyword is None and number(a.value) for a in node.args)
            return False

        return bool(values) and all(number(value) for value in values)

    def _stacks_samples(self, s: cst.CSTNode) -> bool:
        """`x = torch.stack([data[i:i + n] for i in ix])`, or `xb, yb = get_batch("train")`
        of a function of the project each of whose `return`s gives such stacks (moved to a
        device or not; nanoGPT's `get_batch`): dimension 0 holds one item of `ix` each,
        the batch's samples."""
        small = s.body[0] if isinstance(s, cst.SimpleStatementLine) else None
        if not isinstance(small, cst.Assign) or not isinstance(small.value, cst.Call):
            return False
        call = small.value
        index = self.script.index
        if index is not None and _stacked(call, set(), index):
            return True
        functions = self.script.callees(call)
        return bool(functions) and all(_returns_stacks(f) for f in functions)

    def _draws_a_batch(self, s: cst.CSTNode) -> bool:
        """`batch = next(batches)` over a DataLoader, or `batch = batch_loader.next()`: a
        function of the project each of whose `return`s gives what such a `next(...)`
        drew (makemore's `InfiniteDataLoader.next()`). A DataLoader's batch is batch-first.
        Also a `try:` (or `if`) that draws one, anew after `StopIteration` (minGPT's
        trainer: `try: batch = next(it) except StopIteration: it = iter(loader); ...`)."""
        if isinstance(s, (cst.Try, cst.If)):
            return any(self._draws_a_batch(line) for line in find(s, cst.SimpleStatementLine))
        if not m.matches(s, m.SimpleStatementLine(body=[m.Assign(value=m.Call())])):
            return False
        call = s.body[0].value
        if self._next_of_loader(call, self.script.module):
            return True
        functions = self.script.callees(call)
        return bool(functions) and all(self._returns_a_batch(f) for f in functions)

    def _next_of_loader(self, call: cst.CSTNode, module) -> bool:
        """`next(it)` where `it` iterates a DataLoader (`iter(loader)`), in `module`."""
        return (
            isinstance(call, cst.Call)
            and self.script.program is not None
            and len(call.args) == 1
            and "builtins.next" in module.index.qualified_names(call.func)
            and any(
                o.kind is Kind.LOADER
                for o in self.script.program.values_of(call.args[0].value, module)
            )
        )

    def _returns_a_batch(self, function) -> bool:
        """Each `return` of `function` gives a name that only `next(...)` of a DataLoader binds."""
        body = function.node.body
        returns = find(body, cst.Return)
        drawn: dict[str, bool] = {}
        for assign in find(body, cst.Assign):
            for name in assigned(assign):
                drawn[name] = drawn.get(name, True) and self._next_of_loader(
                    assign.value, function.module
                )
        return bool(returns) and all(
            isinstance(r.value, cst.Name)
            and drawn.get(r.value.value, False)
            or r.value is not None
            and self._next_of_loader(r.value, function.module)
            for r in returns
        )

    def _batch_size(self, s: cst.CSTNode) -> bool:
        """`n = x.size(0)`, `n = x.shape[0]`, `n = len(x)`: a number of samples, which
        `nn.DataParallel` would not split."""
        return m.matches(s, m.SimpleStatementLine(body=[m.Assign()])) and self._size_of(
            s.body[0].value
        )

    def _size_of(self, expr: cst.BaseExpression) -> bool:
        """`x.size(0)`, `x.shape[0]`, `len(x)`: how many samples `x` holds."""
        first = [m.SubscriptElement(slice=m.Index(value=m.Integer("0")))]
        return m.matches(
            expr,
            m.Call(func=m.Attribute(attr=m.Name("size")), args=[m.Arg(value=m.Integer("0"))])
            | m.Subscript(
                value=m.Attribute(attr=m.Name("shape"))
                | m.Call(func=m.Attribute(attr=m.Name("size"))),
                slice=first,
            ),
        ) or (isinstance(expr, cst.Call) and "builtins.len" in self.t.qualified_names(expr.func))

    def _sized_by(self, s: cst.CSTNode, sizes: set[str]) -> bool:
        """`y = torch.ones(n).to(device)` with `n` a size of the batch: batch-first."""
        if not m.matches(s, m.SimpleStatementLine(body=[m.Assign()])):
            return False
        value = s.body[0].value
        while isinstance(value, cst.Call):
            first = self._first_size(value)
            if first is not None:
                return isinstance(first, cst.Name) and first.value in sizes
            value = (
                value.func.value if isinstance(value.func, cst.Attribute) else None
            )  # `.to(device)`
        return False

    def _reduces_batch(self, s: cst.CSTNode) -> bool:
        """`d_real_loss = bce(out, y)`, `total = out.sum()`: one value for the whole batch
        (a 0-dim tensor), not one per sample."""
        return m.matches(
            s, m.SimpleStatementLine(body=[m.Assign() | m.AugAssign()])
        ) and self._scalar(s.body[0].value, set())

    def _mixes_batch(self, s: cst.CSTNode) -> bool:
        """`mu = x.mean(0)`, `both = torch.cat([a, b])`: not one row per sample (but
        `torch.cat([state, action], 1)` is)."""
        return any(
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value in _ACROSS_BATCH_METHODS
            and self._across_dim0(call)
            or self.t.qualified_names(call.func) & _ACROSS_BATCH_FUNCTIONS
            and not _along_a_later_dim(call)
            for call in find(s, cst.Call)
        )

    def _batch_sized(self, s: cst.CSTNode, loop) -> bool:
        """`real_labels = torch.ones(batch_size, 1).to(device)`: a new tensor whose first
        size is the loader's `batch_size=` (the same constant, or the same name bound once
        in the script). It has the batch's first dimension, and the loss pairs them."""
        sizes = {self._loader_batch_size(obj) for obj in loop.loaders}
        if len(sizes) != 1 or None in sizes:
            return False
        configured = sizes.pop()
        if not (
            isinstance(s, cst.SimpleStatementLine)
            and len(s.body) == 1
            and isinstance(s.body[0], cst.Assign)
        ):
            return False
        value = s.body[0].value
        first = None
        while isinstance(value, cst.Call) and first is None:
            first = self._first_size(value)
            value = (
                value.func.value if isinstance(value.func, cst.Attribute) else None
            )  # `.to(device)`
        if first is None or not first.deep_equals(configured):
            return False
        if isinstance(first, cst.Integer):
            return True
        root = first
        while isinstance(root, cst.Attribute):  # `opt.batch_size`
            root = root.value
        return isinstance(root, cst.Name) and self._bound_once(root.value)

    def _first_size(self, call: cst.Call) -> cst.BaseExpression | None:
        """The first dimension a tensor factory is asked for: `torch.ones(n, 1)`,
        `torch.full((n,), 1.0)`, `torch.randint(0, T, (n,))`."""
        qualified = self.t.qualified_names(call.func)
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        if qualified & _FACTORIES and positional:
            size = positional[0]
        elif "torch.randint" in qualified:
            size = keyword_value(call, "size") or (positional[-1] if len(positional) > 1 else None)
        else:
            return None
        if isinstance(size, (cst.Tuple, cst.List)):
            return size.elements[0].value if size.elements else None
        return size

    def _loader_batch_size(self, loader) -> cst.BaseExpression | None:
        call = loader.node
        if not isinstance(call, cst.Call) or loader.module is not self.script.module:
            return None
        positional = [a.value for a in call.args if a.keyword is None]
        return keyword_value(call, "batch_size") or (positional[1] if len(positional) > 1 else None)

    def _bound_once(self, name: str) -> bool:
        """`name` is bound by one statement or parameter in the whole script."""
        bindings = sum(name in assigned(s) for s in find(self.t.tree, cst.SimpleStatementLine))
        bindings += sum(p.name.value == name for p in find(self.t.tree, cst.Param))
        return bindings == 1

    @staticmethod
    def _moved(statements) -> set[str]:
        """Names bound to a tensor moved to a device (`.to(...)`, `.cuda()`) or made on one
        (`device=`) in the step."""
        moved: set[str] = set()
        for s in statements:
            moves = any(
                isinstance(c.func, cst.Attribute)
                and c.func.attr.value in ("to", "cuda")
                or keyword_value(c, "device") is not None
                for c in find(s, cst.Call)
            )
            if moves or read(s) & moved:
                moved |= assigned(s)
        return moved

    @staticmethod
    def _flattens(s: cst.CSTNode) -> bool:
        for call in find(s, cst.Call):
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in _FLATTENING:
                if call.func.attr.value == "flatten" and not call.args:
                    return True
                first = call.args[0].value if call.args else None
                if isinstance(first, cst.UnaryOperation) and code_of(first) == "-1":
                    return True
        return False

    def _kept(self, chain, defined, scalars, loss_name) -> list[tuple[str, bool]]:
        """The names the chain binds that other lines of its function read."""
        scope = next(
            (a for a in self.t.ancestors(chain[0]) if isinstance(a, cst.FunctionDef)), self.t.tree
        )
        inside = {id(n) for s in chain for n in find(s, cst.Name)}
        # other functions and classes have scopes of their own (`VAE.forward`'s `log_var`)
        nested = {
            id(s)
            for d in find(scope, (cst.FunctionDef, cst.ClassDef))
            if d is not scope
            for s in find(d, cst.SimpleStatementLine)
        }
        later = {
            n.value
            for s in find(scope, cst.SimpleStatementLine)
            if s not in chain and id(s) not in nested
            for n in find(s, cst.Name)
            if id(n) not in inside
        }
        for s in find(scope, cst.BaseCompoundStatement):
            if not isinstance(s, (cst.FunctionDef, cst.ClassDef)):
                later |= read(getattr(s, "test", None) or getattr(s, "iter", None) or cst.Name("_"))
        kept = []
        for name in sorted(defined & later, key=lambda n: (n != loss_name, n)):
            if name == loss_name:
                continue
            if name in scalars:
                kept.append((name, True))
                continue
            places = self._unpacked_from_model(chain, name)
            if places:
                self._by_the_run(
                    name,
                    f"`{name}` comes from a model returning several values and is read after"
                    " the step; it is not known to be batch-first, so gathering it along"
                    " dimension 0 could be wrong",
                    chain[0],
                    places,
                    FactsResolver.output_batch_first,
                )
            kept.append((name, False))
        return kept

    def _unpacked_from_model(self, chain, name) -> list[tuple[cst.Call, int | None]]:
        """The model calls whose results the chain unpacks `name` from, with the index of
        its element in what the model returns (None where that is not plain to see:
        `a, *b = model(x)`, `a, b = f(model(x))`)."""
        places = []
        for s in chain:
            assign = s.body[0]
            calls = self._model_calls(assign.value) if isinstance(assign, cst.Assign) else []
            for target in assign.targets if calls else ():
                if isinstance(target.target, (cst.Tuple, cst.List)) and name in assigned(target):
                    direct = assign.value in calls
                    places.append(
                        (calls[0], _element_index(target.target, name) if direct else None)
                    )
        return places

    def _call_reduction(self, call: cst.Call) -> str | None:
        """ "mean" / "sum" for a loss call or a whole-tensor `.mean()` / `torch.sum(x)`;
        "?" for a loss call that reduces otherwise; None for any other call."""
        if self.script.is_loss_call(call):
            return self.t._reduction(call) or "?"
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in ("mean", "sum") and not call.args:
            return func.attr.value
        qualified = self.t.qualified_names(func)
        for how in ("mean", "sum"):
            if f"torch.{how}" in qualified and len(call.args) == 1 and call.args[0].keyword is None:
                return how
        return None

    def _loss_function(self, call: cst.Call, depth: int = 0) -> str | None:
        """A function of this script used as a loss (`distillation(out, y, teacher_out, T,
        alpha)`): "mean" or "sum" when every `return` reduces the batch that way, "?"
        when one does not, None when `call` is not such a function (nor one that calls
        a loss, a reduction or a model)."""
        if depth > 2 or not isinstance(call.func, cst.Name):
            return None
        # the function the name holds, also through a parameter (`train(..., loss_fn=distillation)`)
        held = [
            obj
            for obj in self.script.values(call.func)
            if isinstance(getattr(obj, "node", None), cst.FunctionDef)
        ]
        if len({obj.node for obj in held}) != 1:
            return None
        if held[0].module is not self.script.module:
            return self._loss_function_elsewhere(call) if depth == 0 else None
        function = held[0].node
        returns = find(function.body, cst.Return)
        if not returns or not any(
            name_key(c.func) in self.models
            or self._call_reduction(c)
            or self._loss_function(c, depth + 1)
            for c in find(function.body, cst.Call)
        ):
            return None  # it computes no loss (`real_samples()` returns a batch)
        # the terms it names first (`BCE = F.binary_cross_entropy(..., reduction="sum")`)
        named = self._named_reductions(function.body.body, depth + 1)
        for name in assigned(function.body) - named.keys():
            named[name] = {"?"}  # bound in a branch or a loop: not followed
        found: set[str] = set()
        for ret in returns:
            if ret.value is None:
                return "?"
            found |= self._expr_reductions(ret.value, named, depth + 1)
        return found.pop() if len(found) == 1 else "?"

    def _loss_function_elsewhere(self, call: cst.Call) -> str | None:
        """How a loss function of another module of the project reduces the batch
        (`criterion = models.loss_function`, vae-cf's; cs230's `net.loss_fn` passed to
        `train()`): "mean" or "sum" where the program's reading of its `return` says so, "?"
        otherwise."""
        return averages_or_sums(self.script, call) or "?"

    def _expr_reductions(self, expr, named: dict[str, set[str]], depth: int = 0) -> set[str]:
        """How the loss terms of `expr` reduce the batch: {"mean"}, {"sum"}, or more
        ("?" for a term that does neither, or a product of two terms)."""
        if isinstance(expr, cst.Call):
            if name_key(expr.func) in self.models:
                return {
                    "mean"
                }  # a model that returns its own loss averages it, as Hugging Face's do
            how = self._call_reduction(expr) or self._loss_function(expr, depth)
            return {how} if how else {"?"}
        if isinstance(expr, cst.Name):
            return named.get(expr.value, set())
        if isinstance(expr, cst.UnaryOperation):
            return self._expr_reductions(expr.expression, named, depth)
        if m.matches(expr, m.BinaryOperation(operator=m.Divide())) and self._size_of(expr.right):
            # `(bce + kld) / x.size(0)`: a sum over the part of the batch each GPU holds,
            # divided by its size, is that part's mean
            left = self._expr_reductions(expr.left, named, depth)
            return {"mean"} if left == {"sum"} else left
        if isinstance(expr, cst.BinaryOperation):
            left = self._expr_reductions(expr.left, named, depth)
            right = self._expr_reductions(expr.right, named, depth)
            if left and right and not isinstance(expr.operator, (cst.Add, cst.Subtract)):
                return {"?"}  # `loss_a * loss_b`: per-GPU products do not combine
            return left | right
        if isinstance(expr, (cst.Integer, cst.Float, cst.Attribute)):
            return set()  # a weight (`args.alpha`, `0.5`)
        return {"?"} if read(expr) & self._chain_tensors else set()

    def _named_reductions(self, statements, depth: int = 0) -> dict[str, set[str]]:
        """How each name the plain assignments of `statements` bind reduces the batch."""
        named: dict[str, set[str]] = {}
        for s in statements:
            if not (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1):
                continue
            small = s.body[0]
            if not isinstance(small, (cst.Assign, cst.AugAssign)):
                continue
            found = self._expr_reductions(small.value, named, depth)
            for name in assigned(s):
                named[name] = found | (
                    named.get(name, set()) if isinstance(small, cst.AugAssign) else set()
                )
        return named

    def _reduce(self, chain, loss_name: str, owner) -> str:
        named = self._named_reductions(chain)
        reductions = named.get(loss_name, set())
        if "?" in reductions:
            raise Refused(
                "a term of the loss does not average or sum over the batch (reduction)", owner
            )
        if reductions == {"sum"}:
            return "sum"
        if "sum" in reductions:
            raise Refused("the loss mixes summed and averaged losses", owner)
        return "mean"

    def _check_forward_attributes(self, chain) -> None:
        """What a replicated model's `forward` does that holds on one GPU only: `self.x =
        ...` is set on a replica and lost; `.to(self.device)` moves every replica's part
        of the batch to the one device stored when the model was built."""
        for s in chain:
            for call in self._model_calls(s):
                for obj in self.script.values(call.func):
                    cls = getattr(obj, "cls", None)
                    method = cls.method("forward") if cls is not None else None
                    if cls is None or method is None or getattr(method, "node", None) is None:
                        continue
                    for target in find(method.node, (cst.AssignTarget, cst.AugAssign)):
                        node = target.target
                        if (
                            isinstance(node, cst.Attribute)
                            and _of_self(node)
                            and (isinstance(target, cst.AugAssign) or self._read(node.attr.value))
                        ):
                            raise Refused(
                                f"`{cls.name}.forward` sets `self.{node.attr.value}` ({self._place(method, target)}):"
                                " `nn.DataParallel` sets it on a replica, and the model never sees it",
                                s,
                            )
                    stored = {
                        t.target.attr.value
                        for c in cls.mro()
                        for t in find(c.node, cst.AssignTarget)
                        if isinstance(t.target, cst.Attribute) and _of_self(t.target)
                    }
                    for moved in find(method.node, cst.Call):
                        device = _stored_device(moved)
                        if device is not None and device.attr.value in stored:
                            raise Refused(
                                f"`{cls.name}.forward` moves tensors to `{code_of(device)}`"
                                f" (`{first_line_of(_statement_of(moved, method.module.index))}`), one device kept"
                                " when the model was built:"
                                " under `nn.DataParallel` each GPU's replica would put its part"
                                " of the batch there; use an input's device (`x.device`)",
                                s,
                            )

    def _read(self, attribute: str) -> bool:
        """Whether the program reads an attribute named `attribute` anywhere, of any
        object (`model.features`, `self.features`): one that is only ever set
        (`self.features = h` in forward, kept for debugging) is lost on a replica
        harmlessly. An over-count, by name: it keeps refusals, never adds a wrong write."""
        program = self.script.program
        modules = program.modules if program is not None else [self.script.module]
        for module in modules:
            set_here = {
                t.target.attr
                for t in find(module.tree, cst.AssignTarget)
                if isinstance(t.target, cst.Attribute)
            }
            if any(
                a.attr.value == attribute and a.attr not in set_here
                for a in find(module.tree, cst.Attribute)
            ):
                return True
        return False

    def _place(self, method, node: cst.CSTNode) -> str:
        """Where `node` of `method` is: its line, or its file and line in another module."""
        if method.module is self.script.module:
            return f"line {self.t.line_of(node)}"
        return where(method.module, node)

    def _anchor(self, statement, first) -> cst.CSTNode:
        """The outermost loop around the step in its function; the span's first line
        in a step function without one."""
        outermost = None
        for ancestor in self.t.ancestors(statement):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                break
            if isinstance(ancestor, (cst.For, cst.While)):
                outermost = ancestor
        return outermost if outermost is not None else first

    def _params(self, models: list[str], inputs: list[str]) -> list[str]:
        params = []
        for text in models:
            base = text.split(".")[-1]
            name = base
            n = 2
            while name in inputs or name in params:
                name = f"{base}{n}"
                n += 1
            params.append(name)
        return params


def step_attribute_set(transform, calls: list[cst.Call]) -> Refused | None:
    """A line of the step, before the first of the model `calls`, that sets an attribute
    of a called model from the step (`model.batch_size = len(y)`) or from the model itself
    (`model.hidden = model.init_hidden()`) where its class reads it (or its class is not
    known): `nn.DataParallel` copies it to every replica, which runs on its part of the
    batch with the whole batch's value."""
    if not calls:
        return None
    first = min(transform.line_of(c) for c in calls)
    step = next(
        (
            a
            for a in transform.ancestors(calls[0])
            if a in transform.script.step_loops or isinstance(a, cst.FunctionDef)
        ),
        None,
    )
    if step is None:
        return None
    bound = assigned(step.body)
    if isinstance(step, cst.FunctionDef):
        bound |= {p.name.value for p in (*step.params.params, *step.params.kwonly_params)}
    else:
        bound |= transform.script.step_loops[step].batch_names
    classes = {
        name_key(c.func): {o.cls for o in transform.script.values(c.func) if o.cls is not None}
        for c in calls
    }
    for target in find(step.body, cst.AssignTarget):
        node = target.target
        if not isinstance(node, cst.Attribute):
            continue
        model = name_key(node.value)
        if model not in classes or transform.line_of(target) >= first:
            continue
        value = transform.parent(target).value
        from_model = any(
            isinstance(c.func, cst.Attribute) and name_key(c.func.value) == model
            for c in find(value, cst.Call)
        )
        attr = node.attr.value
        if (read(value) & bound or from_model) and (
            not classes[model] or any(_reads_own(cls, attr) for cls in classes[model])
        ):
            return Refused(
                f"the step sets `{model}.{attr}` before the forward pass: each `nn.DataParallel`"
                " replica would see the whole batch's value",
                transform.parent(transform.parent(target)),
            )
    return None


def _reads_own(cls, attr: str) -> bool:
    """Whether a method of `cls` (or of its project bases), `__init__` aside, reads
    `self.<attr>`."""
    for c in cls.mro():
        for name, method in c.methods.items():
            if name == "__init__":
                continue
            written = {
                id(a) for t in find(method.node, cst.AssignTarget) for a in find(t, cst.Attribute)
            }
            if any(
                id(a) not in written
                and m.matches(a, m.Attribute(value=m.Name("self"), attr=m.Name(attr)))
                for a in find(method.node, cst.Attribute)
            ):
                return True
    return False


def is_autocast_block(transform, node: cst.CSTNode) -> bool:
    """`with torch.autocast(...):` (and nothing else in its header)."""
    return isinstance(node, cst.With) and all(
        m.matches(item, m.WithItem(item=m.Call(), asname=None))
        and transform.qualified_names(item.item.func) & _AUTOCAST
        for item in node.items
    )


def displays_a_container(line: cst.CSTNode, name: str) -> bool:
    """`graph = (x, edge_index)`: `name` bound to a tuple, list or dict display."""
    return m.matches(
        line,
        m.SimpleStatementLine(
            body=[
                m.Assign(
                    targets=[m.AssignTarget(target=m.Name(name))],
                    value=m.Tuple() | m.List() | m.Dict(),
                )
            ]
        ),
    )


def _no_loader(loop: object, script) -> bool:
    """Whether `loop` is a step loop whose batches are known to come from no torch
    DataLoader (keyed seq2seq's torchtext `BucketIterator`: `[len, batch]` tensors); not
    when what it reads is unknown."""
    if not isinstance(loop, StepLoop) or loop.loaders or loop.role is not LoopRole.TRAIN:
        return False
    source = batch_source(loop.node, script.index) if isinstance(loop.node, cst.For) else None
    values = script.flat_values(source) if source is not None else frozenset()
    return bool(values) and all(o.kind in _NOT_LOADERS for o in values)


# What batches come from that no DataLoader made: a library's iterator, a project's object.
_NOT_LOADERS = frozenset({Kind.EXTERNAL, Kind.INSTANCE})


def held_batch_first(facts: FactsResolver, call: cst.Call, index: int) -> BatchFirst:
    """Whether the positional argument `index` of `call` was batch-first on every call the
    run made there; for a tuple or list, whether every element was (`nn.DataParallel`
    splits each along dimension 0)."""
    forwards = facts.forwards_at(call)
    held = [seen.args[index] for f in forwards for seen in f.seen if index < len(seen.args)]
    sizes = {len(shape) for shape in held}
    if not held or len(sizes) != 1 or not all(map(_holds_elements, held)):
        return facts.argument_batch_first(call, index)
    for element in range(sizes.pop()):
        shown = batch_first(forwards, lambda seen, e=element: seen.args[index][e])  # type: ignore[misc]
        if shown.known is not True:
            return BatchFirst(shown.known, f"its element {element}: {shown.why}")
    return BatchFirst(True, f"each of its {len(held[0])} elements is batch-first")


def _holds_elements(shape: object) -> bool:
    """A recorded tuple or list (its elements' shapes), not a tensor's shape (numbers)."""
    return isinstance(shape, tuple) and bool(shape) and not any(isinstance(d, int) for d in shape)


def _along_a_later_dim(call: cst.Call) -> bool:
    """`torch.cat([state, action], 1)`, `torch.sum(x, dim=2)`: a torch function that joins
    or reduces along a dimension after the batch's (a positive one), per sample."""
    positional = [a.value for a in call.args if a.keyword is None]
    dim = keyword_value(call, "dim") or (positional[1] if len(positional) > 1 else None)
    return isinstance(dim, cst.Integer) and int(dim.value) > 0


def _compound(s: cst.CSTNode) -> str:
    """`an `if` block`, `a `for` block`, ...; for a line, the line (`x.append(y)`, no
    assignment)."""
    if isinstance(s, cst.SimpleStatementLine):
        return f"`{first_line_of(s)}`, a line that assigns nothing"
    keyword = type(s).__name__.lower()
    return f"an `{keyword}` block" if keyword[0] in "aeiou" else f"a `{keyword}` block"


def _plain_line(s: cst.CSTNode) -> bool:
    """`y = f(x)`, `y += f(x)`, `y: T = f(x)` alone on its line."""
    assignment = m.Assign() | m.AugAssign() | m.AnnAssign(value=m.MatchIfTrue(bool))
    return m.matches(s, m.SimpleStatementLine(body=[assignment]))


def _lines(s: cst.CSTNode) -> list[cst.CSTNode]:
    """A line of the chain, or the lines of its autocast block or of every branch of its
    `if` (see `_plain`)."""
    if isinstance(s, cst.With) and isinstance(s.body, cst.IndentedBlock):
        return list(s.body.body)
    if isinstance(s, cst.If):
        return [line for branch in _branches(s) if branch is not None for line in branch.body]
    return [s]


def _in_reading_order(s: cst.CSTNode) -> list[cst.CSTNode]:
    """A line of the chain, or its autocast block's header items or its `if`'s tests,
    then its lines."""
    if isinstance(s, cst.With):
        return [*s.items, *_lines(s)]
    if isinstance(s, cst.If):
        return [*_conditions(s), *_lines(s)]
    return [s]


def _branches(s: cst.If) -> list[cst.BaseSuite | None]:
    """The blocks of an `if` / `elif` / `else` chain, in order; None last where it has no `else`."""
    branches: list[cst.BaseSuite | None] = []
    node: cst.If | cst.Else | None = s
    while isinstance(node, cst.If):
        branches.append(node.body)
        node = node.orelse
    branches.append(node.body if node is not None else None)
    return branches


def _conditions(s: cst.If) -> list[cst.BaseExpression]:
    """The tests of an `if` / `elif` chain."""
    found = []
    node: cst.If | cst.Else | None = s
    while isinstance(node, cst.If):
        found.append(node.test)
        node = node.orelse
    return found


def _tests(s: cst.If) -> set[str]:
    """The names the tests of an `if` / `elif` chain read."""
    return {name for test in _conditions(s) for name in read(test)}


def _statements_of(line: cst.CSTNode) -> list[cst.CSTNode]:
    """The statements of `n = x.size(0); y = torch.ones(n)` one by one (a line of one
    statement, or a compound statement, as it is)."""
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) > 1:
        return [cst.SimpleStatementLine(body=[small]) for small in line.body]
    return [line]


def _in_place(method: str) -> bool:
    """`fill_`, `add_`: torch's in-place spelling; `append`, `update`: a container's."""
    return method.endswith("_") and not method.startswith("__") or method in _MUTATORS


def _element_index(target: cst.Tuple | cst.List, name: str) -> int | None:
    """Where `name` is among the elements of an unpacking target (None behind a `*rest`)."""
    for index, element in enumerate(target.elements):
        if isinstance(element, cst.StarredElement):
            return None
        if m.matches(element.value, m.Name(name)):
            return index
    return None


def defined_in_loop_after(chain, name) -> set[str]:
    """`{name}` when a line of the chain binds `name` after reading it (a state fed back)."""
    seen_read = False
    for s in chain:
        if name in read(s):
            seen_read = True
        if seen_read and name in assigned(s):
            return {name}
    return set()


def is_enumerate(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Name) and call.func.value == "enumerate"


def training_backward_calls(transform, module: cst.Module) -> list[cst.Call]:
    """`.backward()` calls that run every training step, or under an `if` in its loop's
    body (a WGAN's generator, trained every `n_critic` steps)."""
    from autoaccel.analysis.shapes import method_calls

    found = []
    for call in method_calls(module, "backward"):
        if not isinstance(call.func, cst.Attribute):
            continue
        role, _ = transform.script.every_step(call)
        if role is LoopRole.TRAIN or _conditional_role(transform, call) is LoopRole.TRAIN:
            found.append(call)
    return found


def _conditional_role(transform, call: cst.Call) -> LoopRole | None:
    """The role of the step loop whose body runs `call` under `if`s only."""
    child: cst.CSTNode = call
    for ancestor in transform.ancestors(call):
        loop = transform.script.step_loops.get(ancestor)
        if loop is not None:
            return loop.role if child is ancestor.body else None
        if isinstance(
            ancestor, (cst.For, cst.While, cst.Try, cst.FunctionDef, cst.Lambda, cst.ClassDef)
        ):
            return None
        child = ancestor
    return None


def _of_self(node: cst.BaseExpression) -> bool:
    """Whether `node` is an attribute of `self` (`self.x`)."""
    return (
        isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and node.value.value == "self"
    )


def _stored_device(call: cst.Call) -> cst.Attribute | None:
    """The attribute of `self` that `call` moves a tensor to, or makes it on:
    `.to(self.device)`, `.cuda(self.gpu)`, `torch.zeros(n, device=self.device)` (a
    property computed from the parameters is each replica's own: not taken as kept)."""
    method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
    positional = [a.value for a in call.args if a.keyword is None]
    candidates = positional[:1] if method in ("to", "cuda") else []
    device = keyword_value(call, "device")
    candidates += [device] if device is not None else []
    return next((c for c in candidates if isinstance(c, cst.Attribute) and _of_self(c)), None)


# Calls that move or convert a tensor and keep its dimensions.
_KEEPS_DIMENSIONS = frozenset({"to", "cuda", "cpu", "pin_memory", "contiguous", "long", "float"})


def _stacked(expression: cst.BaseExpression, names: set[str], index) -> bool:
    """Whether `expression` is a stack of one item per element along dimension 0
    (`torch.stack([... for i in ix])`), or one of `names`, moved or converted."""
    while (
        isinstance(expression, cst.Call)
        and isinstance(expression.func, cst.Attribute)
        and expression.func.attr.value in _KEEPS_DIMENSIONS
    ):
        expression = expression.func.value
    if isinstance(expression, cst.Name):
        return expression.value in names
    return (
        isinstance(expression, cst.Call)
        and "torch.stack" in index.qualified_names(expression.func)
        and bool(expression.args)
        and isinstance(expression.args[0].value, (cst.ListComp, cst.GeneratorExp))
        and keyword_value(expression, "dim") is None
        and len(expression.args) == 1
    )


def _returns_stacks(function) -> bool:
    """Each `return` of `function` gives stacks of one item per element (`_stacked`), or a
    tuple of them, through the straight assignments before it."""
    index = function.module.index
    stacked: set[str] = set()
    for assign in find(function.node.body, cst.Assign):
        if len(assign.targets) != 1:
            continue
        target, value = assign.targets[0].target, assign.value
        pairs = (
            zip(target.elements, value.elements)
            if isinstance(target, cst.Tuple)
            and isinstance(value, cst.Tuple)
            and len(target.elements) == len(value.elements)
            else [(target, value)]
        )
        for bound, made in pairs:
            name = bound.value if isinstance(bound, cst.Element) else bound
            expression = made.value if isinstance(made, cst.BaseElement) else made
            if isinstance(name, cst.Name):
                if _stacked(expression, stacked, index):
                    stacked.add(name.value)
                else:
                    stacked.discard(name.value)
    returns = find(function.node.body, cst.Return)
    return bool(returns) and all(
        r.value is not None and all(_stacked(e, stacked, index) for e in tuple_items(r.value))
        for r in returns
    )


def _statement_of(node: cst.CSTNode, index) -> cst.CSTNode:
    """The statement around `node` (of the module `index` indexes)."""
    return next(
        (
            a
            for a in index.ancestors(node)
            if isinstance(a, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
        ),
        node,
    )
