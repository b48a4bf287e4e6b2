"""Train each model through a `DistributedDataParallel` wrapper.

`ddp_model = DDP(model, ...) if DISTRIBUTED else model` goes right after the model is
built and on its device; the training step loops call `ddp_model(...)` (directly, or
passed as the argument of a training function). `model` itself stays the bare module,
so `model.state_dict()` has no `module.` prefix, the model's own methods still work,
and evaluation runs on the plain model without any communication.
"""

from __future__ import annotations

from collections.abc import Callable, Set as AbstractSet
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from autoaccel.analysis.index import ModuleIndex, descendants
from autoaccel.analysis.module_methods import (
    LOCAL_MODULE_METHODS,
    attribute_assignments,
    computing_methods,
)
from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import ClassInfo, FunctionInfo, Kind, Obj, Program
from autoaccel.analysis.script_model import strip_device_moves
from autoaccel.analysis.shapes import find, is_method_call, is_name, is_no_grad_block, name_calls
from autoaccel.analysis.side_effects import PRINTS
from autoaccel.analysis.training import optimized_parameters
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    LOCAL_RANK,
    MAIN_TEST,
    DistributedStep,
    PassedModel,
    TrainedModel,
    builds,
    passed_args,
    ddp_name,
    fresh_name,
    item_container,
    local_names,
    model_key,
    parameters_of,
    parse_statements,
)
from autoaccel.convert.transforms.inserted_names import variable_names
from autoaccel.cst_edit import code_of

DDP_IMPORT = "from torch.nn.parallel import DistributedDataParallel as DDP"
METHOD_AS_FORWARD = "MethodAsForward"
_METHOD_AS_FORWARD_CODE = f'''
class {METHOD_AS_FORWARD}(torch.nn.Module):
    """Runs `method` of `module` as its forward(): DDP averages gradients only for a
    forward() called through it."""

    def __init__(self, module, method):
        super().__init__()
        self.module = module
        self.method = method

    def forward(self, *args, **kwargs):
        return getattr(self.module, self.method)(*args, **kwargs)
'''
# What `nn.Parameter(...)` may be called as (an attribute that holds one has parameters).
_PARAMETER = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})
# What a training function may do with a model it receives, once that is a DDP wrapper
# (not `named_parameters()` nor `state_dict()`: their names gain a `module.` prefix).
_DDP_METHODS = frozenset({"train", "eval", "zero_grad", "parameters", "no_sync", "forward"})
# What a function given the wrapper reads of the model itself: `unwrapped(model).temperature`.
UNWRAPPED = "unwrapped"
_UNWRAPPED_CODE = f'''
def {UNWRAPPED}(model):
    """The model itself, also where DDP wraps it: its own attributes and state dict."""
    return model.module if isinstance(model, DDP) else model
'''


class WrapModel(DistributedStep):
    DESCRIPTION = "Wrap the trained model(s) in DistributedDataParallel."

    def visit_Module(self, node: cst.Module) -> None:
        self.tree = node
        bound = {name_key(a.target) for a in find(node, cst.AssignTarget)}
        # model calls and arguments of training functions -> the wrapper they use
        self.rewrites: dict[cst.CSTNode, str] = {}
        models, moved_away = placed_models(self, node, self._wraps_in_caller)
        loops = self.train_loops()
        if (
            not models and not moved_away and loops and not self.ddp_wrappers(node)
        ):  # (none: converted before)
            self.skipped(
                "DistributedDataParallel",
                f"no trained model was recognised in this training loop{self._run_trained()},"
                " so nothing is wrapped and every process trains its own copy; wrap the model"
                " in `DistributedDataParallel` by hand",
                loops[0],
                wrong=True,
            )
        # A model the loops call beside ones whose parameters an optimizer gets, while
        # none gets its own, may be frozen (a distillation teacher, a DQN target). By
        # name: two models built by one function are one object to the analysis. So may
        # one whose optimizers are all built on a condition (fine-tuning switched off),
        # and each of several when no optimizer is known to get any (its parameters come
        # from a helper): one may be a loss module without parameters (RealNVP's).
        optimized = {
            model.key for model in models if not _optimized_on_condition(self, model.key)
        } & self.script.trained
        # a wrapper name the script does not use yet: `ddp_model`, else `ddp_model2`, ...
        used = bound | variable_names(node)
        self._used = used
        self.wrappers: dict[str, str] = {}
        for model in models:
            self.wrappers[model.key] = fresh_name(ddp_name(model.key), used)
            used.add(self.wrappers[model.key])
            self._wrap(
                model,
                may_be_frozen=model.key not in optimized and (bool(optimized) or len(models) > 1),
            )

    def _run_trained(self) -> str:
        """What the run of the script saw train, where the code alone found nothing."""
        facts = self.run_facts()
        made = facts.trained_models() if facts is not None else []
        if facts is None or not made:
            return ""
        return (
            f" (the run trained {self._facts_made(facts, made)}, which reaches it through names"
            " the conversion cannot follow: function parameters or attributes)"
        )

    def _wrap(self, model: TrainedModel, may_be_frozen: bool) -> None:
        # the methods of the model's classes of the project: a function given the wrapper
        # must not call them on it (they compute with its layers outside DDP's forward),
        # but those that compute nothing with them (`init_hidden()`) on the model itself
        classes = {o.cls for o in self.script.held_by(model.key) if o.cls is not None}
        self.own_methods = {name for cls in classes for c in cls.mro() for name in c.methods}
        self.plain_methods = self.own_methods - {
            name for cls in classes for name in computing_methods(cls)
        }
        if model.key in self.trained_methods:
            self._wrap_method(model, self.trained_methods[model.key])
            return
        # The model under its own name, or as a parameter of the functions it is given to.
        names = {model.key} | self.script.names_of(self.script.held_by(model.key))
        forwards = [call for call in self.step_calls(self.tree) if model_key(call.func) in names]
        # Calls under the model's own name first: each must reach the wrapper. A call
        # under another name that cannot (a gradient penalty `D(x)` in a helper given
        # either discriminator) then stays on the bare model: its gradients add up in the
        # same backward as the wrapper's forward, which DDP averages. Without such a
        # wrapper forward (the model only ever called under other names), it is refused.
        forwards.sort(key=lambda call: model_key(call.func) != model.key)
        plan: dict[cst.CSTNode, str] = {}
        through_wrapper = False
        for call in forwards:
            if self._inference_only(call):
                continue  # on the bare model: no gradient to average, no process waits
            attempt = dict(plan)  # a route that fails half-way leaves no rewrite behind
            self.obstacle: cst.CSTNode | None = None  # why a function cannot take the wrapper
            self.unwraps: set[cst.Attribute | cst.Arg] = set()  # the model's own attributes
            own_name = model_key(call.func) == model.key
            if self._route(model, call, attempt):
                plan = attempt | dict.fromkeys(self.unwraps, UNWRAPPED)
                through_wrapper = through_wrapper or own_name
            elif own_name or not through_wrapper:
                self.skipped(
                    "DistributedDataParallel",
                    f"this forward pass cannot be routed to a DDP wrapper of `{model.key}`"
                    f"{self._obstacle_note()}, so `{model.key}` is not wrapped; build"
                    f" `{self.wrappers[model.key]} = DDP({model.key}, ...)` once `{model.key}` is on"
                    " its device and call it here by hand",
                    call,
                    wrong=True,
                )
                return
        for passed in self.passed_models.get(model.key, []):
            # passed to a function of another module (`mylib.train_step(model, ...)`)
            self.obstacle = None
            held = self._holds(model, self.scope_of(passed.arg))
            if not (held and self._elsewhere_takes_wrapper(passed)):
                self.skipped(
                    "DistributedDataParallel",
                    f"`{passed.function.name}` of {passed.function.module.path} cannot be given a DDP"
                    f" wrapper of `{model.key}`{self._obstacle_note()}, so `{model.key}` is not"
                    f" wrapped; build `{self.wrappers[model.key]} = DDP({model.key}, ...)` once"
                    f" `{model.key}` is on its device and pass it here by hand",
                    passed.arg,
                    wrong=True,
                )
                return
            plan[passed.arg] = self.wrappers[model.key]
        self.rewrites.update(plan)
        if UNWRAPPED in plan.values():
            self.define_helper(self.tree, UNWRAPPED, _UNWRAPPED_CODE)
        key, wrapper = model.key, self.wrappers[model.key]
        condition, note = DISTRIBUTED, ""
        if may_be_frozen:  # DDP raises for a module without trainable parameters
            condition += f" and any(p.requires_grad for p in {key}.parameters())"
            note = "# (when it has trainable parameters: DDP refuses a frozen model)\n"
        # layers `forward` never reads, or no optimizer trains, get no gradient, and DDP
        # would wait for theirs
        unused = _layers_left_out(self, key, "forward") or []
        if unused:
            verb, them = ("get", "them") if unused[1:] else ("gets", "it")
            note += f"# ({', '.join(f'`{u}`' for u in unused)} {verb} no gradient: DDP must not wait for {them})\n"
        constant = _constant_buffers(self, key)
        if constant:
            verb = "never change" if ", " in constant else "never changes"
            note += (
                f"# ({constant} {verb} in training: no broadcast from rank 0 at every forward)\n"
            )
        self.after.setdefault(model.anchor, []).extend(
            parse_statements(
                "# trained through DDP when distributed: gradients are averaged in backward()\n"
                f"{note}"
                f"{wrapper} = {key}\n"
                f"if {condition}:\n"
                f"    {wrapper} = DDP({key}, device_ids=[{LOCAL_RANK}]"
                f" if next({key}.parameters()).is_cuda else None"
                f"{', find_unused_parameters=True' if unused else ''}"
                f"{', broadcast_buffers=False' if constant else ''})\n"
            )
        )
        self.imports.append(DDP_IMPORT)
        self.changed(
            model.anchor,
            f"`{wrapper}`: `{key}` wrapped in DistributedDataParallel for training"
            f" (gradients averaged over processes){' where it has trainable parameters' if may_be_frozen else ''}"
            f"{'; its constant buffers not broadcast at every forward' if constant else ''};"
            f" `{key}` stays the bare model",
        )

    def _wrap_method(self, model: TrainedModel, calls: list[cst.Call]) -> None:
        """Train `model` through a DDP wrapper whose forward() runs the method of the
        model that the training `calls` run (`self.policy.evaluate(s, a)`): those calls
        go to the wrapper, `model` stays the bare module."""
        key = model.key
        method = calls[0].func.attr.value  # type: ignore[attr-defined]
        other = next((c for c in calls if c.func.attr.value != method), None)  # type: ignore[attr-defined]
        unrouted = other or next(
            (
                c
                for c in calls
                if not self._inference_only(c) and not self._holds(model, self.scope_of(c))
            ),
            None,
        )
        if unrouted is not None:
            reason = (
                f"`{key}` trains through `{method}()` and `{other.func.attr.value}()`: a DDP"  # type: ignore[attr-defined]
                " wrapper runs one method as its forward(), and two wrappers of one model would"
                " each average its gradients"
                if other is not None
                else f"this call of `{key}.{method}()` is in a function that receives the model"
                " under another name, which the conversion cannot route to a DDP wrapper"
            )
            self.skipped(
                "DistributedDataParallel",
                f"{reason}, so `{key}` is not wrapped; have the model's forward() do what it"
                " trains through, wrap the model in DDP and call the wrapper, by hand",
                unrouted,
                wrong=True,
            )
            return
        wrapper = fresh_name(f"{ddp_name(key)}_{method}", self._used)
        self._used.add(wrapper)
        for call in calls:
            if not self._inference_only(call):
                self.rewrites[call] = wrapper
        left_out = _layers_left_out(self, key, method)
        unused = ", find_unused_parameters=True" if left_out != [] else ""
        note = ""
        if left_out is None:
            note = f"# (which layers `{method}()` uses is not known here: DDP must not wait for the others)\n"
        elif left_out:
            layers = ", ".join(f"`{name}`" for name in left_out)
            note = f"# (it leaves out the parameters of {layers}: DDP must not wait for their gradients)\n"
        self.after.setdefault(model.anchor, []).extend(
            parse_statements(
                f"# `{method}()` trains `{key}`: when distributed, a DDP wrapper runs it as its\n"
                "# forward(), which averages the gradients in backward()\n"
                f"{note}"
                f"{wrapper} = {key}.{method}\n"
                f"if {DISTRIBUTED}:\n"
                f'    {wrapper} = DDP({METHOD_AS_FORWARD}({key}, "{method}"), device_ids=[{LOCAL_RANK}]'
                f" if next({key}.parameters()).is_cuda else None{unused})\n"
            )
        )
        self.define_helper(self.tree, METHOD_AS_FORWARD, _METHOD_AS_FORWARD_CODE)
        self.imports.append(DDP_IMPORT)
        self.needs_torch = True  # `MethodAsForward` is a `torch.nn.Module`
        self.changed(
            model.anchor,
            f"`{wrapper}`: `{key}.{method}()`, which trains `{key}`, run as the forward() of a"
            " DistributedDataParallel wrapper (gradients averaged over processes)"
            f"{', find_unused_parameters=True' if unused else ''}; `{key}` stays the bare model",
        )

    def _route(self, model: TrainedModel, call: cst.Call, plan: dict[cst.CSTNode, str]) -> bool:
        """Plan how `call` reaches the wrapper: call it directly, or receive it as the
        argument of a training function (through any number of calls). False when
        neither works."""
        function = self.scope_of(call)
        name = model_key(call.func)
        if name == model.key and self._holds(model, function):
            plan[call] = self.wrappers[model.key]
            return True
        return name is not None and self._route_through(model, function, name, plan, {})

    def _inference_only(self, call: cst.Call) -> bool:
        """Whether `call` runs in a function whose forward passes cannot reach a backward
        pass (see `_infers`): hunkim's char-RNN prints `generate(decoder, ...)`, which
        calls `decoder.init_hidden()`; makemore's `print_samples()` calls `generate(model,
        ...)`, which calls `model.get_block_size()`. The bare model there needs no other
        process, and has the model's own methods."""
        function = self.scope_of(call)
        return function is not None and self._infers(function, set())

    def _infers(self, function: cst.FunctionDef, seen: set[cst.FunctionDef]) -> bool:
        """Whether `function` computes without training: no backward pass, optimizer step
        or store into an attribute or global, and each of its calls is in a print, a
        statement of its own (the result dropped), or in another such function."""
        if function in seen:
            return True
        seen.add(function)
        if (
            any(is_method_call(c, "backward", "step") for c in find(function, cst.Call))
            or find(function, (cst.Global, cst.Nonlocal))
            or not _stores_locally(function)
        ):
            return False
        sites = name_calls(self.tree, function.name.value)
        return bool(sites) and all(self._result_unused(site, seen) for site in sites)

    def _result_unused(self, site: cst.Call, seen: set[cst.FunctionDef]) -> bool:
        """Whether what the call `site` returns can only be shown or dropped."""
        ancestors = list(self.ancestors(site))
        if any(
            isinstance(a, cst.Call) and self.qualified_names(a.func) & PRINTS for a in ancestors
        ):
            return True
        if isinstance(ancestors[0], cst.Expr):
            return True
        caller = self.scope_of(site)
        return caller is not None and self._infers(caller, seen)

    def _holds(self, model: TrainedModel, function: cst.FunctionDef | None) -> bool:
        """Whether code of `function` sees the model itself under `model.key`."""
        home = self.scope_of(model.anchor)
        name = item_container(model.key) or model.key  # `models` of `models["net"]`
        return (
            model.key.startswith("self.")
            or function is home
            or (
                home is None  # a module global (built at top level or under `if __name__ == ...`)
                and (function is None or name not in local_names(function))
            )
        )

    def _route_through(
        self,
        model: TrainedModel,
        function: cst.FunctionDef | None,
        name: str,
        plan: dict[cst.CSTNode, str],
        routed: dict[cst.FunctionDef, bool],
    ) -> bool:
        """Pass the wrapper for `function`'s parameter `name` at every call site: the
        model itself where the caller holds it, else the caller's own parameter, passed
        on the same way. `routed`: the functions planned so far, and whether they could
        be (False while under way: a recursion is not routed)."""
        if function in routed:
            return routed[function]  # type: ignore[index]
        params = parameters_of(function)
        if function is None or name not in params or not self._takes_wrapper(function, name, set()):
            return False
        routed[function] = False
        index = params.index(name)
        sites = name_calls(self.tree, function.name.value)
        for site in sites:
            positional = [a for a in site.args if a.keyword is None and not a.star]
            arg = next((a for a in site.args if a.keyword and a.keyword.value == name), None)
            arg = arg or (positional[index] if index < len(positional) else None)
            passed = None if arg is None else name_key(arg.value)
            if passed is None:
                return False
            caller = self.scope_of(site)
            if passed == model.key and self._holds(model, caller):
                plan[arg] = self.wrappers[model.key]
            elif not self._route_through(model, caller, passed, plan, routed):
                return False
        routed[function] = bool(sites)
        return routed[function]

    def _takes_wrapper(
        self, function: cst.FunctionDef, key: str, seen: set[cst.FunctionDef]
    ) -> bool:
        """Whether `function` works alike given a DDP wrapper as its parameter `key`: it
        calls it, calls the methods DDP forwards, reads other attributes (kept in
        `self.unwraps`, read from `unwrapped(model)`: `model.temperature`,
        `model.state_dict()`) but not the methods of the model's own class, and passes it
        on only to functions of the script that do the same. Anything else (`save(model,
        path)`, `return model`) would see the wrapper's `module.` prefix."""
        seen.add(function)
        for read in find(function.body, cst.Name):
            if read.value != key:
                continue
            parent = self.parent(read)
            if isinstance(parent, cst.Call) and parent.func is read:
                continue  # the forward pass
            if isinstance(parent, cst.Attribute) and (
                parent.attr is read or parent.attr.value in _DDP_METHODS
            ):
                continue
            if isinstance(parent, cst.Arg) and parent.keyword is read:
                continue
            if isinstance(parent, cst.Attribute) and self._model_attribute(parent, read):
                self.unwraps.add(parent)  # `model.temperature`: read from the model itself
                continue
            if isinstance(parent, cst.Arg) and self._passed_to_keeper(parent):
                self.unwraps.add(parent)  # `load_checkpoint(path, unwrapped(model))`
                continue
            if not (isinstance(parent, cst.Arg) and self._passed_to_taker(parent, seen)):
                self.obstacle = self.obstacle or self.statement_of(read)
                return False
        return True

    def _passed_to_keeper(self, arg: cst.Arg) -> bool:
        """Whether `arg` goes to functions of the project that train nothing (cs230's
        `utils.load_checkpoint(path, model, optimizer)`, a `load_state_dict`; its
        `evaluate(model, ...)`, forward passes only): they get the model itself, as before."""
        call = self.parent(arg)
        program = self.script.program
        if not isinstance(call, cst.Call) or arg.star or program is None:
            return False
        functions = program.callees.get(call, set())
        positional = [a for a in call.args if a.keyword is None]
        return bool(functions) and all(
            (param := _parameter_for(arg, positional, function.node)) is not None
            and not _trains_or_passes_on(function.node, param)
            and not _runs_for_training(function, param)
            for function in functions
        )

    def _model_attribute(self, node: cst.Attribute, read: cst.Name) -> bool:
        """Whether `node` reads an attribute of the model `read` names that the model itself
        may give where the function gets the wrapper: a value or submodule (`model.
        temperature`, `model.teacher.eval()`), a method of `nn.Module` or of the model's
        class that computes nothing with its layers (`model.state_dict()`,
        `model.init_hidden(n)`), a submodule run under `torch.no_grad()` (a frozen
        teacher's forward); not another method of the model's class, nor any other call
        (it may compute with the model's layers, outside DDP's forward)."""
        if node.value is not read:
            return False
        name = node.attr.value
        parent = self.parent(node)
        called = isinstance(parent, cst.Call) and parent.func is node
        return name not in (self.own_methods - self.plain_methods) | {"module"} and (
            not called
            or name in LOCAL_MODULE_METHODS | self.plain_methods
            or self.under_no_grad(node)
        )

    def _elsewhere_takes_wrapper(self, passed: PassedModel) -> bool:
        """`_takes_wrapper` for a function of another module: its parameter is only
        called, or has the methods DDP forwards called (a function it is passed on to is
        not followed: that is an obstacle too)."""
        body = passed.function.node.body
        fine: set[cst.CSTNode] = set()
        for node in find(body, (cst.Call, cst.Attribute, cst.Arg)):
            if isinstance(node, cst.Call):
                fine.add(node.func)  # the forward pass
            elif isinstance(node, cst.Attribute):
                fine.add(node.attr)  # `x.model`: another object's attribute
                if node.attr.value in _DDP_METHODS:
                    fine.add(node.value)
            elif node.keyword is not None:
                fine.add(node.keyword)
        for read in find(body, cst.Name):
            if read.value == passed.param and read not in fine:
                statements = [
                    s for s in find(body, cst.SimpleStatementLine) if read in descendants(s)
                ]
                self.obstacle = statements[0] if statements else None
                return False
        return True

    def _wraps_in_caller(self, handover: Handover) -> bool:
        """Wrap where the caller builds the model when the function that receives it runs
        once per epoch (a new DDP each time otherwise) and takes the wrapper alike."""
        return handover.in_loop and self._elsewhere_takes_wrapper(handover.passed)

    def _obstacle_note(self) -> str:
        """Why the wrapper could not be passed on, from the last `_takes_wrapper`."""
        if self.obstacle is None:
            return ""
        code = cst.Module([]).code_for_node(self.obstacle).strip().splitlines()[0]
        return (
            f" (the function it would be passed to also runs `{code}`, which a DDP wrapper"
            " does not do alike: it lacks the model's own methods, and its `state_dict()`"
            " and parameter names start with `module.`)"
        )

    def _passed_to_taker(self, arg: cst.Arg, seen: set[cst.FunctionDef]) -> bool:
        """Whether the function of the script that `arg` is passed to takes a wrapper
        for that parameter (see `_takes_wrapper`)."""
        call = self.parent(arg)
        if not isinstance(call, cst.Call) or arg.star:
            return False
        functions = [
            f for f in find(self.tree, cst.FunctionDef) if is_name(call.func, f.name.value)
        ]
        if len(functions) != 1:
            return False
        positional = [a for a in call.args if a.keyword is None]
        param = _parameter_for(arg, positional, functions[0])
        if param is None:
            return False
        return functions[0] in seen or self._takes_wrapper(functions[0], param, seen)

    def edited(self) -> list[cst.CSTNode]:
        return [*self.planned_statements(), *self.rewrites]

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.Attribute:
        if self.rewrites.get(original_node) != UNWRAPPED:
            return updated_node
        self.changed(
            original_node,
            f"`{code_of(original_node)}` read from the model itself (`{UNWRAPPED}()`): the"
            " function is given the DDP wrapper",
        )
        return updated_node.with_changes(
            value=cst.Call(cst.Name(UNWRAPPED), [cst.Arg(updated_node.value)])
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node not in self.rewrites:
            return updated_node
        what = "evaluation" if self.under_no_grad(original_node) else "training"
        return self._to_wrapper(original_node, updated_node, "func", f"{what} forward pass through")

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if self.rewrites.get(original_node) == UNWRAPPED:
            self.changed(
                original_node,
                f"`{code_of(original_node.value)}` passed as the model itself"
                f" (`{UNWRAPPED}()`): the function is given the DDP wrapper",
            )
            return updated_node.with_changes(
                value=cst.Call(cst.Name(UNWRAPPED), [cst.Arg(updated_node.value)])
            )
        return self._to_wrapper(
            original_node, updated_node, "value", "the training function receives"
        )

    def _to_wrapper(self, original: cst.CSTNode, updated, field: str, what: str):  # type: ignore[no-untyped-def]
        wrapper = self.rewrites.get(original)
        if wrapper is None:
            return updated
        self.changed(original, f"{what} `{wrapper}`")
        return updated.with_changes(**{field: cst.parse_expression(wrapper)})


def _parameter_for(
    arg: cst.Arg, positional: list[cst.Arg], function: cst.FunctionDef
) -> str | None:
    """The parameter of `function` that `arg` of a call binds (None: not known)."""
    if arg.keyword is not None:
        return arg.keyword.value
    params = parameters_of(function)
    at = positional.index(arg)
    return params[at] if at < len(params) else None


def _trains_or_passes_on(function: cst.FunctionDef, param: str) -> bool:
    """Whether `function` trains anything (`backward()`, `step()`) or passes its parameter
    `param` on to another call."""
    return any(
        is_method_call(call, "backward", "step") or any(is_name(a.value, param) for a in call.args)
        for call in find(function.body, cst.Call)
    )


def _runs_for_training(function: FunctionInfo, param: str) -> bool:
    """Whether `function` runs its model `param` where the result may be trained on: a
    forward pass outside `torch.no_grad()` in a function that does not put the model in
    evaluation mode (`param.eval()`, cs230's `evaluate()`). A helper computing the loss
    the caller back-propagates must get the DDP wrapper."""
    index = function.module.index
    body = function.node.body
    evaluates = any(
        is_method_call(call, "eval") and is_name(call.func.value, param)  # type: ignore[attr-defined]
        for call in find(body, cst.Call)
    )
    return not evaluates and any(
        is_name(call.func, param)
        and not any(is_no_grad_block(a, index.qualified_names) for a in index.ancestors(call))
        for call in find(body, cst.Call)
    )


@dataclass(frozen=True)
class Handover:
    """A call that hands a model its caller builds to the function that trains it."""

    site: cst.Call  # the call
    passed: PassedModel  # the caller's name for the model, its argument, the function
    model: TrainedModel  # where the caller has built it, before the call
    in_loop: bool  # the call runs in a loop of the caller (an epoch's helper)
    optimized: bool  # an optimizer of the model's parameters is built before the call


def placed_models(
    step: DistributedStep, module: cst.Module, moves: Callable[[Handover], bool]
) -> tuple[list[TrainedModel], bool]:
    """The trained models of `module` (each once), each where it is wrapped or sharded,
    and whether one of them goes to another module. A model that a function receives
    from callers that build it is wrapped there instead when every call `moves` it (an
    epoch's helper, called once per epoch): in this module, or in the caller's module,
    which takes it as a model passed to another module (`step.passed_models`) when the
    function calls it itself."""
    program = step.script.program
    assert program is not None
    placed: list[TrainedModel] = []
    moved_away = False
    for model in unique_models(step.trained_models(module)):
        handovers = _handovers_of(step, model)
        if handovers and all(moves(h) for h in handovers):
            here = [h.model for h in handovers if program.module_of[h.site] is step.script.module]
            placed += here
            moved_away = moved_away or not here
        else:
            placed.append(model)
    wrappers = step.ddp_wrappers(module)  # (passed already: converted before)
    for call in find(module, cst.Call):
        for function in step.script.callees(call):
            if (
                function.module is step.script.module
                or function not in step.script.training.trainers
            ):
                continue
            for arg, param in passed_args(call, function):
                if name_key(arg.value) in wrappers or not _trained(step, arg.value):
                    continue
                handovers = _handovers(step, function, param) if _forwards(function, param) else []
                if handovers and all(moves(h) for h in handovers):
                    handover = next(h for h in handovers if h.passed.arg is arg)
                    placed.append(handover.model)
                    step.passed_models.setdefault(handover.passed.key, []).append(handover.passed)
    return unique_models(placed), moved_away


def _handovers_of(step: DistributedStep, model: TrainedModel) -> list[Handover]:
    """The calls that hand `model` to the function of this module that receives it (as
    a parameter, or stores it as `self.model = model.to(device)`), where each caller
    builds it; [] when the model is not received, or some caller does not build it."""
    function = step.scope_of(model.anchor)
    program = step.script.program
    info = program.functions.get(function) if program is not None and function is not None else None
    if info is None or not _trained(step, model.key):
        return []
    param = model.key
    assigned = model.anchor.body[0] if isinstance(model.anchor, cst.SimpleStatementLine) else None
    if (
        isinstance(assigned, cst.Assign)
        and len(assigned.targets) == 1
        and name_key(assigned.targets[0].target) == model.key
    ):
        param = name_key(strip_device_moves(assigned.value)) or param
    if param not in info.positional or any(
        name_key(t.target) == param for t in find(info.node.body, cst.AssignTarget)
    ):
        return []
    handovers = _handovers(step, info, param)
    elsewhere = any(step.script.program.module_of[h.site] is not step.script.module for h in handovers)  # type: ignore[union-attr]
    # (a caller's module takes a model that the function calls itself: `_forwards`)
    return [] if elsewhere and not _forwards(info, param) else handovers


def _handovers(step: DistributedStep, function: FunctionInfo, param: str) -> list[Handover]:
    """The call of `function` in the program, each handing it, as its parameter `param`,
    a model the caller's scope builds before the call; [] when one does not."""
    program = step.script.program
    assert program is not None
    found = []
    for site in program.calls_of(function):
        arg = next((a for a, p in passed_args(site, function) if p == param), None)
        alias = name_key(arg.value) if arg is not None and isinstance(arg.value, cst.Name) else None
        if alias is None:
            return []
        caller = program.module_of[site]
        in_loop, statement, block = False, site, None
        for ancestor in caller.index.ancestors(site):
            if isinstance(ancestor, cst.IndentedBlock) and isinstance(
                caller.index.parent(ancestor), cst.FunctionDef
            ):
                block = ancestor
                break
            in_loop = in_loop or isinstance(ancestor, (cst.For, cst.While))
            statement = ancestor
        if block is None:
            return []
        before = list(block.body[: block.body.index(statement)])
        builders = [s for s in before if builds(s, alias)]
        if not builders:
            return []
        optimized = any(
            is_method_call(call, "parameters", "named_parameters") and name_key(call.func.value) == alias  # type: ignore[attr-defined]
            for s in before
            for call in find(s, cst.Call)
        )
        passed = PassedModel(alias, arg, function, param)  # type: ignore[arg-type]
        model = TrainedModel(alias, block, builders[-1], statement)  # type: ignore[arg-type]
        found.append(Handover(site, passed, model, in_loop, optimized))
    return found


def _forwards(function: FunctionInfo, param: str) -> bool:
    """Whether `function` calls its parameter `param` itself (a forward pass)."""
    return any(is_name(call.func, param) for call in find(function.node.body, cst.Call))


def _trained(step: DistributedStep, node: cst.BaseExpression | str) -> bool:
    """Whether the name or expression `node` of this module holds a model an optimizer
    trains."""
    held = step.script.held_by(node) if isinstance(node, str) else step.script.values(node)
    return any(obj.kind is Kind.MODULE and step.script.trains(obj) for obj in held)


def _optimized_on_condition(step: DistributedStep, key: str) -> bool:
    """Whether each optimizer of the parameters of the model `key` is built on a
    condition only: in a branch of `... if fine_tune else None`, or of an `if` with no
    `else` (one with an `else` picks which optimizer to build), in its function."""
    program = step.script.program
    assert program is not None
    models = {o for o in step.script.held_by(key) if o.kind is Kind.MODULE}
    found = {
        optimizer
        for optimizer, obj in optimized_parameters(program)
        if program.parameters_of(obj) & models
    }
    return bool(found) and all(_on_condition(o.node, o.module.index) for o in found)


def _on_condition(node: cst.CSTNode, index: ModuleIndex) -> bool:
    """Whether `node` runs in a branch of an `IfExp`, or of an `if` with no `else` (not
    `if __name__ == "__main__":`), of its function or module."""
    for ancestor in index.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
            return False
        if isinstance(ancestor, cst.IfExp) or (
            isinstance(ancestor, cst.If)
            and ancestor.orelse is None
            and not m.matches(ancestor.test, MAIN_TEST)
        ):
            return True
    return False


def unique_models(models: list[TrainedModel]) -> list[TrainedModel]:
    """Each model once: a model that the step calls under its own name and that a helper
    receives too (WGAN-GP's critic, called in the step and in `compute_gradient_penalty(D,
    ...)`) is found both ways, and must be wrapped (or sharded) once."""
    unique: dict[str, TrainedModel] = {}
    for model in models:
        unique.setdefault(model.key, model)
    return list(unique.values())


def _stores_locally(function: cst.FunctionDef) -> bool:
    """Whether every assignment of `function` stores into its own variables: `x = ...`,
    `a, b = ...`, `logits[mask] = ...` for a `logits` it assigned (not an attribute, nor
    an item of a parameter or global)."""
    targets = [t.target for t in find(function, cst.AssignTarget)]
    names: list[cst.BaseExpression] = []
    while targets:
        target = targets.pop()
        if isinstance(target, (cst.Tuple, cst.List)):
            targets += [element.value for element in target.elements]
        else:
            names.append(target)
    local = {name.value for name in names if isinstance(name, cst.Name)}
    return all(
        isinstance(name, cst.Name)
        or isinstance(name, cst.Subscript)
        and isinstance(name.value, cst.Name)
        and name.value.value in local
        for name in names
    )


# What an optimizer's parameters come from: the receiver of each `.parameters()` call,
# with the objects it may hold and, for an attribute (`distiller.connector`), those its
# base may hold.
Sources = list[tuple[cst.BaseExpression, AbstractSet[Obj], AbstractSet[Obj]]]


def _optimized_sources(step: DistributedStep) -> Sources:
    """The receivers of the `.parameters()` calls that give the optimizers of the program
    their parameters (`student`, `distiller.connector`), with what each may hold."""
    program = step.script.program
    if program is None:
        return []
    found: Sources = []
    for optimizer, obj in optimized_parameters(program):
        call = obj.node
        if isinstance(call, cst.Call):
            receiver = call.func.value  # type: ignore[attr-defined]
            module = program.module_of.get(call, optimizer.module)
            base: AbstractSet[Obj] = (
                program.values_of(receiver.value, module)
                if isinstance(receiver, cst.Attribute)
                else frozenset()
            )
            found.append((receiver, program.values_of(receiver, module), base))
    return found


def _optimized(attribute: str, models: list, sources: Sources) -> bool:
    """Whether an optimizer trains the layer held in `attribute` (of the model), which
    holds `models`: its parameters are given by that name (`distiller.connector`) or
    by another that holds the same object (`student`)."""
    return any(
        (isinstance(source, cst.Attribute) and source.attr.value == attribute)
        or not values.isdisjoint(models)
        for source, values, _ in sources
    )


# Layers whose buffers change in training (running statistics).
_RUNNING_STATISTICS = frozenset(
    f"torch.nn.{name}"
    for name in (
        "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "InstanceNorm1d",
        "InstanceNorm2d", "InstanceNorm3d", "LazyBatchNorm1d", "LazyBatchNorm2d",
        "LazyBatchNorm3d", "LazyInstanceNorm1d", "LazyInstanceNorm2d", "LazyInstanceNorm3d",
    )
)  # fmt: skip


def _constant_buffers(step: DistributedStep, key: str) -> str:
    """The buffers the project's classes register (`self.register_buffer("pe", pe)`), as
    a list to show, when the model `key` is one of the project's classes and no buffer of
    the program ever changes: every one is registered under a literal name that no code
    assigns or changes in place again (`self.pe.mul_(...)`), and no layer keeps running
    statistics. DDP then need not broadcast them from rank 0 at every forward (it does
    by default, and fails on a strided view such as `pe.unsqueeze(0).transpose(0, 1)`:
    transformer time-series in the eleventh unseen set); empty otherwise."""
    program = step.script.program
    held = {o for o in step.script.held_by(key) if o.kind is Kind.MODULE}
    if program is None or not held or any(o.cls is None for o in held):
        return ""
    names: list[str] = []
    for module in program.modules:
        calls = find(module.tree, cst.Call)
        if any(module.index.qualified_names(c.func) & _RUNNING_STATISTICS for c in calls):
            return ""
        for call in calls:
            if is_method_call(call, "register_buffer"):
                name = call.args[0].value if call.args else None
                if not isinstance(name, cst.SimpleString):
                    return ""
                names.append(str(name.evaluated_value))
    if not names or any(_changed(program, name) for name in names):
        return ""
    return ", ".join(f"`{name}`" for name in dict.fromkeys(names))


def _changed(program: Program, name: str) -> bool:
    """Whether any code of the program assigns an attribute `name` (`self.pe = ...`,
    `self.pe[0] = ...`) or calls an in-place method on it (`self.pe.add_(...)`, a
    name ending in `_`); by name, of any object: an over-count."""
    for module in program.modules:
        for target in find(module.tree, (cst.AssignTarget, cst.AugAssign)):
            assert isinstance(target, (cst.AssignTarget, cst.AugAssign))
            node: cst.BaseExpression = target.target
            while isinstance(node, cst.Subscript):
                node = node.value
            if isinstance(node, cst.Attribute) and node.attr.value == name:
                return True
        for call in find(module.tree, cst.Call):
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value.endswith("_")
                and isinstance(func.value, cst.Attribute)
                and func.value.attr.value == name
            ):
                return True
    return False


def _layers_left_out(step: DistributedStep, key: str, method: str) -> list[str] | None:
    """The attributes of the model `key` that hold layers or parameters
    (`self.critic = nn.Linear(...)`, `nn.Parameter(...)`) and that `method` reads
    neither itself nor through the methods of `self` it calls, or that hold models no
    optimizer trains where the optimizers train parts of `key` (a teacher inside a
    distiller, whose outputs are detached): they get no gradient, and DDP waits for every
    parameter's unless told (`find_unused_parameters=True`). None when the model's class
    is not known (it may leave any out). A name that holds models of several classes (a
    `fit(model)` given a teacher, then a student) leaves out what any of them does."""
    program = step.script.program
    held = {o for o in step.script.held_by(key) if o.kind is Kind.MODULE}
    classes = {o.cls for o in held if o.cls is not None}  # (a library's module: all its layers)
    if program is None or not classes:
        return None
    found = [_class_layers_left_out(step, cls, held, method) for cls in classes]
    return sorted({name for names in found for name in names})


def _class_layers_left_out(
    step: DistributedStep, cls: ClassInfo, held: set[Obj], method: str
) -> list[str]:
    """`_layers_left_out` for the models of `cls` among those `held`."""
    program = step.script.program
    assert program is not None
    sources = _optimized_sources(step)
    trained_whole = not sources or any(  # (no optimizer: nothing tells)
        values & held and not (base & held) for _, values, base in sources
    )
    layers: set[str] = set()
    untrained: set[str] = set()
    for owner in cls.mro():
        for function in owner.methods.values():
            for target, value in attribute_assignments(function.node.body):
                models = [
                    o for o in program.values_of(value, owner.module) if o.kind is Kind.MODULE
                ]
                holds = bool(models) or any(
                    owner.module.index.qualified_names(call.func) & _PARAMETER
                    for call in find(value, cst.Call)
                )
                frozen = any(  # `teacher.requires_grad_(False)`: no gradient to wait for
                    is_method_call(call, "requires_grad_")
                    and [code_of(a.value) for a in call.args] == ["False"]
                    for call in find(value, cst.Call)
                )
                if not holds or frozen:
                    continue
                layers.add(target)
                if models and not trained_whole and not _optimized(target, models, sources):
                    untrained.add(target)
    read: set[str] = set()
    methods = [method]
    while methods:
        function = cls.method(methods.pop())
        if function is None:
            continue
        for attribute in find(function.node.body, cst.Attribute):
            name = attribute.attr.value
            if is_name(attribute.value, "self") and name not in read:
                read.add(name)
                methods.append(name)  # a method of `self` it calls
        if (
            any(is_name(call.func, "self") for call in find(function.node.body, cst.Call))
            and "forward" not in read
        ):
            read.add("forward")
            methods.append("forward")
    return sorted((layers - read) | (untrained & layers))
