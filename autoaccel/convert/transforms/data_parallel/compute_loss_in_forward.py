"""Each GPU computes its own loss inside `forward` (the seeds' balanced DataParallel).

    outputs = model(inputs)
    loss = criterion(outputs, targets)      ->    loss = model_with_loss(inputs, targets).mean()

`model_with_loss` is a generated `ModelWithLoss(model, criterion)` module, wrapped in
`nn.DataParallel` when the model lives on a GPU and created just before the training loop,
so DataParallel gathers one loss per GPU instead of every output on GPU 0. `model` still
names the bare model: `model.state_dict()`, `model.eval()` and the user's own methods work
without `.module`. On the CPU and on one GPU the converted step computes what it did.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.loss_reduction import averages_or_sums
from autoaccel.analysis.names import name_key
from autoaccel.analysis.project import SCRIPT
from autoaccel.analysis.script_model import DISTRIBUTED_DATA_PARALLEL, LoopRole, StepLoop
from autoaccel.analysis.shapes import find, is_method_call, method_calls, name_calls
from autoaccel.convert.log import ConversionLog
from autoaccel.convert.transform import StatementRewrite
from autoaccel.convert.transforms.data_parallel.step_segments import (
    Refused,
    Segment,
    SegmentFinder,
    assigned,
    displays_a_container,
    is_autocast_block,
    read,
    step_attribute_set,
    training_backward_calls,
)
from autoaccel.convert.transforms.data_parallel.wraps import (
    GENERAL_CLASS,
    WRAPPER_CLASS,
    aliases,
    data_parallel_wraps,
    single_assign,
    single_positional,
    wrapper_instances,
)
from autoaccel.convert.transforms.distributed._base import uncalled_function
from autoaccel.convert.transforms.inserted_names import name_refusal
from autoaccel.cst_edit import add_imports, code_of, keyword_value, leading_import_block

_STEP = "loss inside forward (--to dp)"
_MAIN_BLOCK = m.If(
    test=m.Comparison(
        left=m.Name("__name__"),
        comparisons=[
            m.ComparisonTarget(
                operator=m.Equal(),
                comparator=m.SimpleString("'__main__'") | m.SimpleString('"__main__"'),
            )
        ],
    )
)
# Tensor methods and attributes that reorder dimensions (`x.t()`, `x.permute(1, 0, 2)`).
_REORDERING = frozenset({"t", "T", "mT", "transpose", "permute", "swapaxes", "swapdims", "movedim"})
_BY_HAND = (
    "; by hand: compute the loss in the `forward` of an `nn.Module` (the model itself, or a"
    " wrapper holding the model and its loss function), wrap that module in `nn.DataParallel`"
    " and call `.mean()` on its result before `backward()`"
)


@dataclass(frozen=True)
class _Site:
    """One training step's forward pass and loss, to be computed by `ModelWithLoss`."""

    forward: cst.SimpleStatementLine | None  # `outputs = model(inputs)`; None: inside the loss
    loss: cst.SimpleStatementLine  # `loss = criterion(outputs, targets)`
    anchor: cst.CSTNode  # the outermost loop around the step: the wrapper is created before it
    model: str
    loss_fn: str
    inputs: cst.BaseExpression
    targets: cst.BaseExpression
    loss_name: str
    outputs: str | None  # the outputs' name when later code reads them
    reduce: str  # how the per-GPU losses combine: "mean" or "sum"

    @property
    def wrapper_name(self) -> str:
        return f"{self.model.removeprefix('self.')}_with_loss"


class ComputeLossInForward(StatementRewrite):
    DESCRIPTION = "Compute each training step's loss inside forward on every GPU (nn.DataParallel)."
    code = "ACC402"

    # -- analysis -------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        self.tree = node
        self.nn = _torch_nn_alias(node)
        self.converted = wrapper_instances(node)
        self.configured_wraps = {
            key
            for wrap in data_parallel_wraps(self, node)
            if not wrap.only_wraps
            for key in aliases({wrap.key}, node)
        }
        self.names_in_use = {n.value for n in find(node, cst.Name)}
        self.sites: dict[cst.CSTNode, _Site] = {}  # keyed by the loss statement
        self.removed: set[cst.CSTNode] = set()
        self.created: dict[cst.CSTNode, _Site] = (
            {}
        )  # anchor -> the site whose wrapper is built there
        self.segments: dict[cst.CSTNode, Segment] = {}  # keyed by the span's first line
        self.segment_lines: set[cst.CSTNode] = set()  # every line of a span
        self.segment_anchors: dict[cst.CSTNode, list[Segment]] = {}
        self.wrappers_after: dict[cst.CSTNode, list[Segment]] = {}  # built after an `__init__` line
        # (what, reason, line) of each step left alone; refusals when no step converts
        self.pending: list[tuple[str, str, cst.CSTNode | None]] = []
        ddp = next(
            (
                c
                for c in find(node, cst.Call)
                if DISTRIBUTED_DATA_PARALLEL in self.qualified_names(c.func)
            ),
            None,
        )
        if ddp is not None:
            self.skipped(
                _STEP,
                "the script already trains with DistributedDataParallel, which beats"
                " nn.DataParallel even on one machine; --to dp would mix the two",
                ddp,
                wrong=True,  # --to dp adds no DataParallel
            )
            return
        refusal = name_refusal(node, self.context.filename)
        if refusal is not None:
            reason, where = refusal
            self.skipped(_STEP, reason, where, wrong=True)
            return
        # a loop in a function nothing in the program calls is another entry point's, one
        # in the `__main__` test of an imported module the module's own
        self.unused = {
            loop.node: why for loop in self.script.step_loops.values()
            if loop.role is LoopRole.TRAIN and (why := self._never_runs(loop)) is not None
        }  # fmt: skip
        for loop_node, why in self.unused.items():
            self.skipped(_STEP, f"this training loop is {why}: left as it is", loop_node)
        planned_changes = len(self.log.changes)
        simple_reasons: dict[cst.CSTNode, str] = {}
        for loop in self.script.step_loops.values():
            if loop.role is LoopRole.TRAIN and loop.node not in self.unused:
                reason = self._plan(loop)
                if reason is not None:
                    simple_reasons[loop.node] = reason
        general_reasons = self._plan_segments(node)
        # a loop whose step the general shape planned or refused has its reason there
        answered = self._loops_around(
            [s.span[0] for s in self.segments.values()] + [w for _, w, _ in general_reasons]
        )
        for loop_node, reason in simple_reasons.items():
            if loop_node in answered or any(loop_node is n for n, _, _ in general_reasons):
                continue
            self.pending.append((_STEP, reason + _BY_HAND, loop_node))
        for _, where, reason in general_reasons:
            self.pending.append((_STEP, reason + _BY_HAND, where))
        if (self.sites or self.segments) and not self._may_use_a_gpu():
            where = self._trained_model_made_here() or next(iter({**self.sites, **self.segments}))
            self._drop_plans(planned_changes)
            self.pending.insert(
                0,
                (
                    "DataParallel (--to dp)",
                    "the script never moves the model to a GPU (no `.cuda()`, no `.to(device)` with"
                    " a CUDA device): `nn.DataParallel` would never run; move the model to cuda first",
                    where,
                ),
            )
        # --to dp that adds no DataParallel is refused (exit 1), as --to ddp is
        refuse = not self.sites and not self.segments and not self.converted
        if refuse and not self.pending and self._trains_elsewhere(node):
            return  # a module of the project that only helps (builds the loaders): nothing to say
        if refuse and not self.pending:
            self.pending.append(
                (
                    "DataParallel (--to dp)",
                    "no training step was found: no `.backward()` runs in a loop over batches",
                    None,
                )
            )
        for what, reason, where in self.pending:
            self.skipped(what, reason, where, wrong=refuse)

    def _trains_elsewhere(self, module: cst.Module) -> bool:
        """This module runs no training step of its own, and another module of the project
        does: that module's conversion adds the DataParallel."""
        if self._used_backward_calls(module):
            return False
        modules = [
            loop.module for loop in self.script.training.step_loops.values()
            if loop.role is LoopRole.TRAIN and self._never_runs(loop) is None
        ]  # fmt: skip
        return bool(modules) and all(module is not self.script.module for module in modules)

    def _never_runs(self, loop: StepLoop) -> str | None:
        """Where `loop` is when the program never runs it: in a function nothing calls, or
        in the `if __name__ == "__main__":` block of a module the script imports."""
        function = uncalled_function(loop, self.script.program)
        if function is not None:
            return f"in `{function.name}()`, which nothing in the program calls"
        module = loop.module
        if module is None or module.name == SCRIPT:
            return None
        for statement in module.tree.body:
            if m.matches(statement, _MAIN_BLOCK) and any(
                n is loop.node for n in find(statement, type(loop.node))
            ):
                name = Path(module.path or module.name).name
                return (
                    f'in the `if __name__ == "__main__":` block of {name}, which runs when'
                    f" {name} is run itself, not when the program imports it"
                )
        return None

    def _may_use_a_gpu(self) -> bool:
        """The script uses CUDA, or moves something with `.to(device)` to a device the code
        does not name (a parameter, `torch.device(args.device)`): it may be a GPU."""
        if self.script.uses_cuda:
            return True
        for call in method_calls(self.tree, "to"):
            device = keyword_value(call, "device") or (call.args[0].value if call.args else None)
            if (
                isinstance(device, (cst.Name, cst.Attribute))
                and not any(q.startswith("torch.") for q in self.qualified_names(device))
                and self.script.device_types(device) != {"cpu"}
            ):
                return True
        return False

    def _drop_plans(self, changes: int) -> None:
        """Forgets every step planned, and the changes logged for them after the first
        `changes`: nothing is rewritten."""
        del self.log.changes[changes:]
        for plans in (
            self.sites,
            self.segments,
            self.created,
            self.segment_anchors,
            self.wrappers_after,
            self.removed,
            self.segment_lines,
        ):
            plans.clear()

    def _trained_model_made_here(self) -> cst.CSTNode | None:
        """Where this module makes the first model an optimizer trains (`RNN()`)."""
        made = [
            obj.node for obj in self.script.training.trained if obj.module is self.script.module
        ]
        return min(made, key=self.line_of, default=None)

    def _used_backward_calls(self, module: cst.Module) -> list[cst.Call]:
        """The training `.backward()` calls of `module` that the program runs: not those
        of loops in functions nothing calls (nor of step functions only they run)."""
        calls = []
        for call in training_backward_calls(self, module):
            loops = self._loops_around([call])
            if not loops or not loops <= self.unused.keys():
                calls.append(call)
        return calls

    def _loops_around(self, nodes: list[cst.CSTNode]) -> set[cst.CSTNode]:
        """The step loops around `nodes`, or running the functions that hold them."""
        found = set()
        functions = set()
        for node in nodes:
            for ancestor in self.ancestors(node):
                if ancestor in self.script.step_loops:
                    found.add(ancestor)
                if isinstance(ancestor, cst.FunctionDef):
                    functions.add(ancestor)
        for node, loop in self.script.step_loops.items():
            # a loop whose step runs in a function the segment is in (`train_step(...)`)
            if any(f.node in functions for f in (*loop.reached, *loop.step_functions)):
                found.add(node)
        return found

    def _plan_segments(self, module: cst.Module) -> list[tuple[cst.CSTNode, cst.CSTNode, str]]:
        """Each training `.backward()` the simple shape did not take: its lines from the
        forward pass to the loss, moved into a function run by `LossInForward`. Returns
        (its loop, the line to name, why) for each step left alone."""
        reasons: list[tuple[cst.CSTNode, cst.CSTNode, str]] = []
        # the loss lines of the simple shape's steps, and the blocks holding them (autocast)
        done = {n for site in self.sites.values() for n in (site.loss, *self.ancestors(site.loss))}
        for call in self._used_backward_calls(module):
            finder = SegmentFinder(self, call)
            statement, _ = finder.loss_owner()
            block = self.parent(statement)
            before = list(block.body)[: list(block.body).index(statement)]  # type: ignore[union-attr]
            if any(s in done for s in before) or any(
                name_key(c.func) in self.converted for s in before for c in find(s, cst.Call)
            ):
                continue  # converted already (the simple shape, or an earlier conversion)
            loop = next((a for a in self.ancestors(call) if a in self.script.step_loops), None)
            try:
                segment = finder.find()
            except Refused as refusal:
                where = refusal.node if refusal.node is not None else statement
                # the branches' `.backward()` of one loss (`if use_amp: ... else: ...`): once
                if all((w, r) != (where, refusal.reason) for _, w, r in reasons):
                    reasons.append((loop if loop is not None else where, where, refusal.reason))
                continue
            if segment is None or any(s in self.segment_lines for s in segment.span):
                continue
            if any(m in self.configured_wraps for m in segment.modules):
                reasons.append(
                    (
                        loop or statement,
                        statement,
                        f"`{segment.modules[0]}` is wrapped in `nn.DataParallel` with its own settings (device_ids, dim, ...)",
                    )
                )
                continue
            segment.function_name = self._fresh(f"compute_{segment.loss_name}")
            segment.wrapper_name = self._fresh(f"{segment.loss_name}_on_gpus")
            self._place(segment)
            self.segments[segment.span[0]] = segment
            self.segment_lines |= set(segment.span)
            self.segment_anchors.setdefault(segment.function_anchor or segment.anchor, []).append(
                segment
            )
            if segment.wrapper_after is not None:
                self.wrappers_after.setdefault(segment.wrapper_after, []).append(segment)
            self.changed(
                segment.span[0],
                f"`{segment.loss_name}` is computed inside `forward` on every GPU by"
                f" `{segment.wrapper_name}` (`nn.DataParallel` of `{GENERAL_CLASS}` running"
                f" `{segment.function_name}` with {', '.join(f'`{m}`' for m in segment.modules)});"
                " the inputs are split along dimension 0"
                + "".join(
                    f"; batch-first as a short run of the script showed: {e}"
                    for e in segment.established
                )
                + "".join(
                    f"; `{frozen}` is not replicated: its outputs carry no gradients (`torch.no_grad()`,"
                    " or no optimizer trains it), so it has none to reduce; it runs on the whole batch"
                    " where it ran, and its outputs are split with the batch"
                    for frozen in segment.frozen
                ),
            )
        return reasons

    def _place(self, seg: Segment) -> None:
        """Builds a step's function and wrapper once, not on every step, where the step
        has no loop of its own to build them before (`train_step(...)`, `_run_batch`):
        the function at the top level when it reads nothing local to the step's function,
        and for a method whose models are attributes assigned in `__init__`
        (`self.model = model.to(device)`), the wrapper there too, as `self.loss_on_gpus`."""
        if seg.anchor is not seg.span[0]:
            return  # built before the loop around the step, once per run of its function
        function = next(
            (a for a in self.ancestors(seg.span[0]) if isinstance(a, cst.FunctionDef)), None
        )
        if function is None:
            return
        top = function
        for ancestor in self.ancestors(function):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                return  # a nested function: its scope is not the module's
            if isinstance(ancestor, (cst.ClassDef, cst.FunctionDef)) or isinstance(
                self.parent(ancestor), cst.Module
            ):
                top = ancestor
            if isinstance(self.parent(ancestor), cst.Module):
                break
        params = {p.name.value for p in (*function.params.params, *function.params.kwonly_params)}
        local = params | {
            n for s in find(function.body, cst.BaseSmallStatement) for n in _assigned_names(s)
        }
        renames = dict(zip(seg.modules, seg.params))
        free = set()
        for statement in seg.chain:
            free |= read(statement.visit(_Replace(renames, seg.prepared.nodes)))
        free -= {*seg.params, *seg.inputs}
        for statement in seg.chain:
            free -= _assigned_names(statement)
        if free & local:
            return  # the function reads the step's locals (`self.args`, `alpha`): it stays in the step
        seg.function_anchor = top
        cls = self.parent(self.parent(function))
        if not (isinstance(cls, cst.ClassDef) and all(_self_attribute(m) for m in seg.modules)):
            return
        init = next(
            (
                s
                for s in cls.body.body
                if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
            ),
            None,
        )
        if init is None:
            return
        body = list(init.body.body)
        keys = set(seg.modules)
        assigning = [s for s in body if assigned(s) & keys]
        if not keys <= {k for s in assigning for k in assigned(s)}:
            return  # a model assigned elsewhere (or in a branch of `__init__`)
        elsewhere = [
            s
            for method in cls.body.body
            if isinstance(method, cst.FunctionDef) and method is not init
            for s in find(method, cst.BaseSmallStatement)
            if _assigned_names_keys(s) & keys
        ]
        if elsewhere:
            return  # a model replaced after `__init__` (a checkpoint loaded into a new one)
        seg.wrapper_after = assigning[-1]
        seg.wrapper_name = f"self.{seg.wrapper_name}"

    def _fresh(self, name: str) -> str:
        candidate, n = name, 2
        while candidate in self.names_in_use:
            candidate = f"{name}{n}"
            n += 1
        self.names_in_use.add(candidate)
        return candidate

    def _plan(self, loop: StepLoop) -> str | None:
        """Plans the simple shape; the reason when it does not apply."""
        site = self._find_site(loop)
        if not isinstance(site, _Site):
            return site
        if any(is_autocast_block(self, a) for a in self._ancestors_in(site.loss, loop.node)):
            # `nn.DataParallel`'s threads would autocast to float16, whatever its dtype
            return f"`{site.loss_name}` is computed under `torch.autocast`"
        built = self.created.get(site.anchor)
        if built is not None and (built.model, built.loss_fn) != (site.model, site.loss_fn):
            return (
                f"another step before this loop already builds `{built.wrapper_name}` from"
                f" `{built.model}` and `{built.loss_fn}`"
            )
        if built is None and site.wrapper_name in self.names_in_use:
            return f"the name `{site.wrapper_name}` is already used in this script"
        self.created.setdefault(site.anchor, site)
        self.sites[site.loss] = site
        if site.forward is not None:
            self.removed.add(site.forward)
        self.changed(
            site.forward or site.loss,
            f"`{site.loss_name}` is computed inside `forward` on every GPU by"
            f" `{site.wrapper_name}` (`nn.DataParallel` of `{WRAPPER_CLASS}({site.model},"
            f" {site.loss_fn})`); `{site.model}` stays the bare model",
        )
        return None

    def _ancestors_in(self, node: cst.CSTNode, outer: cst.CSTNode) -> list[cst.CSTNode]:
        """The nodes around `node` inside `outer`."""
        found = []
        for ancestor in self.ancestors(node):
            if ancestor is outer:
                break
            found.append(ancestor)
        return found

    def _find_site(self, loop: StepLoop) -> _Site | str | None:
        """The step's site, a reason why it cannot be rewritten, or None when already done."""
        calls = find(loop.node.body, cst.Call)
        called = [c for c in calls if name_key(c.func) in self.script.models | self.converted]
        models = sorted({name_key(c.func) for c in called})  # type: ignore[type-var]
        if set(models) & self.converted:
            return None
        if not models:
            return "no model is called in this training step (the forward pass and the loss are computed elsewhere, e.g. in a helper)"
        if len(models) > 1:
            return f"several models are called in this training step ({', '.join(f'`{k}`' for k in models)}); each needs its own loss-computing wrapper"
        model = models[0]
        if model in self.configured_wraps:
            return f"`{model}` is wrapped in `nn.DataParallel` with its own settings (device_ids, dim, ...)"
        if len(called) > 1:
            return f"`{model}` is called {len(called)} times in this training step"
        call = called[0]
        attribute = step_attribute_set(self, [call])
        if attribute is not None:
            return attribute.reason  # the general shape names its line
        assign = single_assign(self._parent(self._parent(call)))  # type: ignore[arg-type]
        if (
            assign is not None
            and assign[1] is call
            and _backpropagates(loop.node, code_of(assign[0]))
        ):
            return f"`{model}(...)` returns the loss itself, which needs no wrapper"
        if not single_positional(call):
            return f"`{model}(...)` takes more than one input; `nn.DataParallel` splits every argument along dimension 0 (a recurrent state too)"
        held = call.args[0].value
        if isinstance(held, cst.Name) and any(
            displays_a_container(s, held.value)
            for s in find(loop.node.body, cst.SimpleStatementLine)
        ):
            return f"`{model}(...)` gets a tuple (`{held.value}`), each tensor of which `nn.DataParallel` splits"
        if any(a.attr.value in _REORDERING for a in find(held, cst.Attribute)):
            # `model(x.t())`: split along dimension 0, the sequence's; the general shape
            # moves the transpose into each replica
            return (
                f"`{model}(...)` gets `{code_of(held)}`, whose dimension 0 may not be the batch's"
            )
        return self._site_from_call(loop, model, call)

    def _site_from_call(self, loop: StepLoop, model: str, call: cst.Call) -> _Site | str:
        parent = self._parent(call)
        forward = None
        if isinstance(parent, cst.Assign):
            forward = self._parent(parent)
            target = single_assign(forward) if forward is not None else None
            if target is None or not isinstance(target[0], cst.Name):
                return f"the output of `{model}(...)` is not bound to one name (the model returns several values)"
            outputs = target[0].value
            loss = self._loss_statement_after(forward, outputs)  # type: ignore[arg-type]
            if isinstance(loss, str):
                return loss
        elif isinstance(parent, cst.Arg) and self.script.is_loss_call(
            loss_call := self._parent(parent)
        ):
            if parent is not loss_call.args[0]:  # type: ignore[union-attr]
                return f"the output of `{model}(...)` is not the loss function's first argument"
            outputs = None
            loss = self._parent(self._parent(self._parent(parent)))  # Call -> Assign -> line
            if single_assign(loss) is None:
                return "the loss is not assigned to a name"
        else:
            return f"the output of `{model}(...)` does not go straight into a loss function"
        loss_name, loss_call = single_assign(loss)  # type: ignore[misc]
        if not isinstance(loss_name, cst.Name) or not self.script.is_loss_call(loss_call):
            return "the loss is not assigned to one name"
        reason = self._loss_call_problem(loss_call, outputs)  # type: ignore[arg-type]
        if reason:
            return reason
        reduce = self._reduction(loss_call)  # type: ignore[arg-type]
        if reduce is None:
            return f"`{code_of(loss_call.func)}` does not average or sum its loss (reduction)"  # type: ignore[attr-defined]
        if not _backpropagates(loop.node, loss_name.value):
            return f"`{loss_name.value}.backward()` is not called in this training step"
        kept = (
            outputs if outputs is not None and _reads(loop.node, outputs, (forward, loss)) else None
        )
        return _Site(
            forward=forward,  # type: ignore[arg-type]
            loss=loss,  # type: ignore[arg-type]
            anchor=self._outermost_loop(loop.node),
            model=code_of(call.func),
            loss_fn=code_of(loss_call.func),  # type: ignore[attr-defined]
            inputs=call.args[0].value,
            targets=loss_call.args[1].value,  # type: ignore[attr-defined]
            loss_name=loss_name.value,
            outputs=kept,
            reduce=reduce,
        )

    def _loss_statement_after(
        self, forward: cst.SimpleStatementLine, outputs: str
    ) -> cst.CSTNode | str:
        """The line `loss = loss_fn(outputs, ...)` later in the forward pass's block."""
        block = self._parent(forward)
        statements = list(block.body)  # type: ignore[union-attr]
        start = statements.index(forward)
        inputs_read = {n.value for n in find(forward, cst.Name)}
        for statement in statements[start + 1 :]:
            assign = single_assign(statement)
            if (
                assign is not None
                and self.script.is_loss_call(assign[1])
                and m.matches(
                    assign[1].args[0].value, m.Name(outputs)  # type: ignore[attr-defined]
                )
            ):
                return statement
            if _reads(statement, outputs) or _assigned_names(statement) & inputs_read:
                break
        return (
            f"the loss is not computed from `{outputs}` in the lines right after the forward pass"
        )

    def _loss_call_problem(self, call: cst.Call, outputs: str | None) -> str | None:
        if len(call.args) != 2 or any(a.keyword is not None or a.star for a in call.args):
            return f"`{code_of(call.func)}(...)` takes other arguments than the outputs and the targets"
        return None

    def _reduction(self, call: cst.Call) -> str | None:
        """ "mean" or "sum": how the loss reduces its batch, read from the criterion's construction."""
        if any(keyword_value(call, legacy) for legacy in ("size_average", "reduce")):
            return _legacy_reduction(call)
        own = keyword_value(call, "reduction")  # `F.mse_loss(out, y, reduction="sum")`
        if own is not None:
            value = own.evaluated_value if isinstance(own, cst.SimpleString) else None
            if value == "batchmean":  # `F.kl_div`: the sum divided by the batch size
                return "mean"
            return value if value in ("mean", "sum") else None
        key = name_key(call.func)
        if key not in self.script.criteria:
            return "mean"  # a functional loss called without keywords
        if any(o.cls is not None for o in self.script.values(call.func)):
            # a loss class of the project (`DiceLoss()`): its forward's `return` tells
            return averages_or_sums(self.script, call)
        reductions: set[object] = set()
        for statement in find(self.tree, cst.SimpleStatementLine):
            assign = single_assign(statement)
            if assign is None or name_key(assign[0]) != key or not isinstance(assign[1], cst.Call):
                continue
            if any(keyword_value(assign[1], legacy) for legacy in ("size_average", "reduce")):
                reductions.add(_legacy_reduction(assign[1]) or "?")
                continue
            value = keyword_value(assign[1], "reduction")
            reductions.add(value.evaluated_value if isinstance(value, cst.SimpleString) else value)
        if reductions <= {None, "mean", "batchmean"}:  # `nn.KLDivLoss(reduction="batchmean")`
            return "mean"
        return "sum" if reductions == {"sum"} else None

    def _parent(self, node: cst.CSTNode | None) -> cst.CSTNode | None:
        return None if node is None else self.parent(node)

    def _outermost_loop(self, loop: cst.CSTNode) -> cst.CSTNode:
        outermost = loop
        parent = self._parent(loop)
        while parent is not None and not isinstance(
            parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)
        ):
            if isinstance(parent, (cst.For, cst.While)):
                outermost = parent
            parent = self._parent(parent)
        return outermost

    # -- rewriting ------------------------------------------------------------------
    def rebuild(
        self, originals: list[cst.CSTNode], updated: list[cst.CSTNode]
    ) -> list[cst.CSTNode]:
        result: list[cst.CSTNode] = []
        carried: list[cst.EmptyLine] = []  # comments and blank lines of a removed forward line
        for original, new in zip(originals, updated):
            if original in self.removed or (
                original in self.segment_lines and original not in self.segments
            ):
                carried += [*new.leading_lines, *_trailing_comment(new)]  # type: ignore[attr-defined]
                continue
            leading = [*carried, *new.leading_lines]  # type: ignore[attr-defined]
            carried = []
            statements = [new.with_changes(leading_lines=[])]
            if original in self.segments:
                statements = self._segment_call(self.segments[original], originals, updated)
            if original in self.created:
                statements = [*self._creation(self.created[original]), *statements]
            if original in self.sites:
                statements[-1:] = self._combined_call(self.sites[original], statements[-1])  # type: ignore[arg-type]
            statements[0] = statements[0].with_changes(leading_lines=leading)
            # The functions and wrappers of the segments go in above the loop, with blank
            # lines of their own; the loop keeps its comments and blank lines.
            for seg in self.segment_anchors.get(original, []):
                result += self._segment_creation(seg)
            result += statements
            for seg in self.wrappers_after.get(original, []):
                result += self._wrapper_creation(seg)
        return result

    def _creation(self, site: _Site) -> list[cst.BaseStatement]:
        name = site.wrapper_name
        return [
            cst.parse_statement(f"{name} = {WRAPPER_CLASS}({site.model}, {site.loss_fn})\n"),
            cst.parse_statement(
                f"if next({site.model}.parameters()).is_cuda:  # one replica per visible GPU\n"
                f"    {name} = {self.nn}.DataParallel({name})\n"
            ),
        ]

    def _segment_creation(self, seg: Segment) -> list[cst.BaseStatement]:
        """`def compute_loss(model, x, y): ...` and its `LossInForward` wrapper."""
        renames = dict(zip(seg.modules, seg.params))
        lines = []
        batch = set(seg.inputs)  # and what the lines compute from the batch
        for statement in seg.chain:
            if read(statement) & batch:
                batch |= assigned(statement)
            replace = _Replace(renames, seg.prepared.nodes, batch)
            lines.append(
                code_of(statement.with_changes(leading_lines=[]).visit(replace)).rstrip("\n")
            )
            for receiver in replace.squeezed:
                self.changed(
                    statement,
                    f"`{receiver}.squeeze()` keeps the batch dimension on each GPU: a GPU's"
                    " part of the batch may hold one sample (the last batch's remainder)",
                )
        returned = ", ".join([seg.loss_name, *(name for name, _ in seg.kept)])
        body = "".join(
            f"    {line}\n" if line.strip() else "\n"
            for text in lines
            for line in text.splitlines()
        )
        function = cst.parse_statement(
            f"def {seg.function_name}({', '.join([*seg.params, *seg.inputs])}):\n"
            "    # runs on each GPU's part of the batch\n"
            f"{body}"
            f"    return {returned}\n"
        )
        anchor = seg.function_anchor or seg.anchor
        nested = isinstance(self.parent(anchor), cst.IndentedBlock)
        blank = [cst.EmptyLine(indent=False)] * (1 if nested else 2)
        if seg.function_anchor is not None:
            return [
                function.with_changes(leading_lines=blank)
            ]  # the wrapper: in the step or `__init__`
        wrapper = self._wrapper_creation(seg)
        return [
            function.with_changes(leading_lines=blank),
            wrapper[0].with_changes(leading_lines=blank),
            *wrapper[1:],
        ]

    def _wrapper_creation(self, seg: Segment) -> list[cst.BaseStatement]:
        """`loss_on_gpus = LossInForward(compute_loss, model)`, in `nn.DataParallel` on a GPU."""
        name = seg.wrapper_name
        return [
            cst.parse_statement(
                f"{name} = {GENERAL_CLASS}({', '.join([seg.function_name, *seg.modules])})\n"
            ),
            cst.parse_statement(
                f"if next({seg.modules[0]}.parameters()).is_cuda:  # one replica per visible GPU\n"
                f"    {name} = {self.nn}.DataParallel({name})\n"
            ),
        ]

    def _segment_call(
        self, seg: Segment, originals: list, updated: list
    ) -> list[cst.BaseStatement]:
        """The span's lines: those that stay before, the wrapper's call, those after."""
        new_of = dict(zip(map(id, originals), updated))
        before = [new_of[id(s)].with_changes(leading_lines=[]) for s in seg.before]
        if seg.function_anchor is not None and seg.wrapper_after is None:
            before += self._wrapper_creation(seg)  # a step function's models are its arguments
        after = [new_of[id(s)].with_changes(leading_lines=[]) for s in seg.after]
        passed = [
            code_of(seg.prepared.codes[name]) if name in seg.prepared.codes else name
            for name in seg.inputs
        ]
        call = f"{seg.wrapper_name}({', '.join(passed)})"
        comment = f"  # {seg.reduce} of the per-GPU losses"
        if not seg.kept:
            lines = [f"{seg.loss_name} = {call}.{seg.reduce}(){comment}\n"]
        else:
            names = ", ".join([seg.loss_name, *(n for n, _ in seg.kept)])
            lines = [
                f"{names} = {call}\n",
                f"{seg.loss_name} = {seg.loss_name}.{seg.reduce}(){comment}\n",
            ]
            lines += [f"{n} = {n}.{seg.reduce}()\n" for n, scalar in seg.kept if scalar]
        return [*before, *(cst.parse_statement(line) for line in lines), *after]

    def _combined_call(self, site: _Site, line: cst.SimpleStatementLine) -> list[cst.BaseStatement]:
        call = cst.Call(
            func=cst.Name(site.wrapper_name),
            args=[
                cst.Arg(site.inputs, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                cst.Arg(site.targets),
            ],
        )
        comment = cst.TrailingWhitespace(
            whitespace=cst.SimpleWhitespace("  "),
            comment=cst.Comment(f"# {site.reduce} of the per-GPU losses"),
        )
        loss = cst.Name(site.loss_name)
        reduced = cst.Call(func=cst.Attribute(value=loss, attr=cst.Name(site.reduce)))
        if site.outputs is None:
            combined = cst.Call(func=cst.Attribute(value=call, attr=cst.Name(site.reduce)))
            if line.trailing_whitespace.comment is not None:
                comment = line.trailing_whitespace  # the user's own comment wins
            return [
                line.with_changes(
                    body=[cst.Assign([cst.AssignTarget(loss)], combined)],
                    trailing_whitespace=comment,
                )
            ]
        both = cst.Tuple([cst.Element(loss), cst.Element(cst.Name(site.outputs))], lpar=[], rpar=[])
        return [
            line.with_changes(body=[cst.Assign([cst.AssignTarget(both)], call)]),
            cst.SimpleStatementLine(
                [cst.Assign([cst.AssignTarget(loss)], reduced)], trailing_whitespace=comment
            ),
        ]

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self.rebuild(list(original_node.body), list(updated_node.body))
        updated_node = updated_node.with_changes(body=body)
        inserted = False
        if self.sites and not _defines_class(updated_node, WRAPPER_CLASS):
            keeps_outputs = any(site.outputs for site in self.sites.values())
            updated_node = _insert_class(
                updated_node, self._wrapper_class(keeps_outputs), WRAPPER_CLASS
            )
            inserted = True
        if self.segments and not _defines_class(updated_node, GENERAL_CLASS):
            updated_node = _insert_class(updated_node, self._general_class(), GENERAL_CLASS)
            inserted = True
        if inserted and self.nn == "torch.nn":
            return add_imports(updated_node, ("torch",))
        return updated_node

    def _general_class(self) -> cst.BaseStatement:
        return cst.parse_statement(
            f"class {GENERAL_CLASS}({self.nn}.Module):\n"
            '    """A model and its loss in one `forward`: under `nn.DataParallel` each GPU runs\n'
            "    `compute` on its part of the batch (every tensor argument split along\n"
            "    dimension 0) and only the losses (one per GPU) are gathered, instead of every\n"
            "    output on GPU 0. `modules`, the models and losses `compute` calls, are\n"
            '    replicated to every GPU and passed to it first."""\n'
            "\n"
            "    def __init__(self, compute, *modules):\n"
            "        super().__init__()\n"
            "        self.compute = compute\n"
            f"        self.parts = {self.nn}.ModuleList(modules)\n"
            "\n"
            "    def forward(self, *batch):\n"
            "        returned = self.compute(*self.parts, *batch)  # the loss, or (loss, *kept)\n"
            "        if isinstance(returned, tuple):\n"
            "            return (returned[0].unsqueeze(0), *returned[1:])\n"
            "        return returned.unsqueeze(0)\n"
        )

    def _wrapper_class(self, keeps_outputs: bool) -> cst.BaseStatement:
        returned = "loss.unsqueeze(0), outputs" if keeps_outputs else "loss.unsqueeze(0)"
        return cst.parse_statement(
            f"class {WRAPPER_CLASS}({self.nn}.Module):\n"
            '    """A model and its loss in one `forward`: under `nn.DataParallel` each GPU\n'
            "    computes the loss of its part of the batch and only the losses (one per GPU)\n"
            '    are gathered, instead of every output on GPU 0."""\n'
            "\n"
            "    def __init__(self, model, loss_fn):\n"
            "        super().__init__()\n"
            "        self.model = model\n"
            "        self.loss_fn = loss_fn\n"
            "\n"
            "    def forward(self, inputs, targets):\n"
            "        outputs = self.model(inputs)\n"
            "        loss = self.loss_fn(outputs, targets)\n"
            f"        return {returned}\n"
        )


def settle_project_refusals(logs: list[ConversionLog], trained: set[int] | None = None) -> None:
    """`--to dp` of a project refuses where no file gets a DataParallel. Where one does,
    a step left alone in another file (a warm-up stage its conversion cannot move)
    trains on one GPU as before: noted, no longer a refusal. Where a run showed which
    files train (`trained`: indexes into `logs`), only a DataParallel in one of them
    counts: one in a GAN class the run never builds speeds up nothing."""
    added = {
        i
        for i, log in enumerate(logs)
        if any(change.code == ComputeLossInForward.code for change in log.changes)
    }
    if not added or (trained is not None and not added & trained):
        return
    for log in logs:
        log.skipped = [
            replace(s, wrong=False) if s.what == _STEP and s.reason.endswith(_BY_HAND) else s
            for s in log.skipped
        ]


def _reads(node: cst.CSTNode, name: str, skip: tuple[cst.CSTNode | None, ...] = ()) -> bool:
    """Whether `node` reads the variable `name` outside the statements in `skip`."""
    found = {id(n) for n in find(node, cst.Name) if n.value == name}
    for other in find(node, (cst.Attribute, cst.Arg)):
        found.discard(id(other.attr if isinstance(other, cst.Attribute) else other.keyword))
    for statement in skip:
        if statement is not None:
            found -= {id(n) for n in find(statement, cst.Name) if n.value == name}
    return bool(found)


def _assigned_names(statement: cst.CSTNode) -> set[str]:
    targets = find(statement, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign))
    return {n.value for target in targets for n in find(target.target, cst.Name)}


def _legacy_reduction(call: cst.Call) -> str | None:
    """`size_average=False` sums, `size_average=True` averages; `reduce=False` keeps one
    loss per element (neither)."""
    reduce = keyword_value(call, "reduce")
    if reduce is not None and not (isinstance(reduce, cst.Name) and reduce.value == "True"):
        return None
    average = keyword_value(call, "size_average")
    if average is None or (isinstance(average, cst.Name) and average.value == "True"):
        return "mean"
    return "sum" if isinstance(average, cst.Name) and average.value == "False" else None


def _self_attribute(key: str) -> bool:
    """`self.model`: an attribute of the instance, one level deep."""
    parts = key.split(".")
    return len(parts) == 2 and parts[0] == "self"


def _assigned_names_keys(statement: cst.CSTNode) -> set[str]:
    return {
        key
        for node in find(statement, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign))
        if (key := name_key(node.target))
    }


def _backpropagates(loop: cst.CSTNode, loss: str) -> bool:
    """Some `X.backward()` in `loop` where X mentions `loss` (also `scaler.scale(loss)`)."""
    return any(
        _reads(call.func.value, loss)  # type: ignore[attr-defined]
        for call in method_calls(loop, "backward")
    )


def _trailing_comment(line: cst.CSTNode) -> list[cst.EmptyLine]:
    trailing = getattr(line, "trailing_whitespace", None)
    if trailing is None or trailing.comment is None:
        return []
    return [cst.EmptyLine(comment=trailing.comment)]


def _torch_nn_alias(module: cst.Module) -> str:
    """How the script spells `torch.nn`: `nn` after `import torch.nn as nn` or
    `from torch import nn`, else `torch.nn`."""
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    if code_of(alias.name) == "torch.nn" and alias.asname is not None:
                        return code_of(alias.asname.name)
            elif (
                isinstance(small, cst.ImportFrom)
                and small.module is not None
                and code_of(small.module) == "torch"
                and not isinstance(small.names, cst.ImportStar)
            ):
                for alias in small.names:
                    if code_of(alias.name) == "nn":
                        return code_of(alias.asname.name) if alias.asname else "nn"
    return "torch.nn"


def _defines_class(module: cst.Module, name: str) -> bool:
    return any(isinstance(s, cst.ClassDef) and s.name.value == name for s in module.body)


def _insert_class(
    module: cst.Module, statement: cst.BaseStatement, name: str = WRAPPER_CLASS
) -> cst.Module:
    """`statement` before the first top-level `class` / `def` when that comes before the
    wrapper's first use, else after the leading imports; two blank lines around it (black)."""
    body = list(module.body)
    _, index = leading_import_block(module)
    first_use = next(i for i, s in enumerate(body) if name_calls(s, name))
    first_definition = next(
        (i for i, s in enumerate(body) if isinstance(s, (cst.ClassDef, cst.FunctionDef))), None
    )
    if first_definition is not None and first_definition <= first_use:
        index = max(index, first_definition)
    two_blank = [cst.EmptyLine(), cst.EmptyLine()]
    if index < len(body):
        following = body[index]
        leading = list(following.leading_lines)
        blank = next(
            (i for i, line in enumerate(leading) if line.comment is not None), len(leading)
        )
        if blank < 2:
            body[index] = following.with_changes(leading_lines=[*two_blank[blank:], *leading])
    body.insert(index, statement.with_changes(leading_lines=two_blank if index else []))
    return module.with_changes(body=body)


class _Replace(cst.CSTTransformer):
    """The models a step's lines call, as written (`self.model`), by the parameters of the
    function that runs them (`model`); the `prepared` expressions of inputs by the inputs'
    names. With the `batch` names (what derives from the batch), `x.squeeze()` of one of
    them squeezes every dimension but the batch's, as it does for two samples or more: on
    a GPU given one sample it would drop the batch dimension too (listed in `squeezed`)."""

    def __init__(
        self,
        renames: dict[str, str],
        prepared: dict[cst.CSTNode, str],
        batch: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        super().__init__()
        self.renames = renames
        self.prepared = prepared
        self.batch = batch
        self.squeezed: list[str] = []

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        name = self.prepared.get(original_node)
        if name:
            return cst.Name(name)
        func = updated_node.func
        if (
            is_method_call(original_node, "squeeze")
            and not original_node.args
            and isinstance(func, cst.Attribute)
            and name_key(func.value) is not None  # a name or an attribute: read twice
            and read(original_node.func) & self.batch
        ):
            receiver = code_of(func.value)
            self.squeezed.append(code_of(original_node.func.value))  # type: ignore[attr-defined]
            return cst.parse_expression(f"{receiver}.squeeze(tuple(range(1, {receiver}.dim())))")
        return updated_node

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        new = self.renames.get(code_of(original_node))
        return cst.Name(new) if new else updated_node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        new = self.renames.get(original_node.value)
        return cst.Name(new) if new else updated_node
