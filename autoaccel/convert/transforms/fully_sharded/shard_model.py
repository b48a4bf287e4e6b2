"""Shard each trained model with FSDP2's `fully_shard`, before its optimizer is built.

`if DISTRIBUTED: shard_model(model)` goes right after the model is built and on its
device. `fully_shard` turns the model's parameters into DTensors in place, so the
training loop keeps calling `model(...)`; an optimizer built from the parameters before
that point would hold the unsharded ones, so its construction moves after it. FSDP gathers
the parameters around `forward()` only: each other method of the model's class that the
script calls and that computes with its layers (a VAE's `model.decode(z)`) is registered
with `register_fsdp_forward_method`, or it would mix sharded and whole tensors. Code that
reads a parameter's tensor (`.data`) or pickles the whole model would see one shard:
the conversion refuses it.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from autoaccel.analysis.module_methods import attribute_assignments, computes_with_layers
from autoaccel.analysis.names import name_key
from autoaccel.analysis.program import ClassInfo, FunctionInfo, Kind, Obj, Program, SourceModule
from autoaccel.analysis.shapes import find, is_method_call, method_calls, tuple_items
from autoaccel.convert.transforms.distributed._base import (
    DISTRIBUTED,
    DistributedStep,
    TrainedModel,
    parse_statements,
    where,
)
from autoaccel.convert.transforms.distributed.wrap_model import (
    Handover,
    placed_models,
)
from autoaccel.convert.transforms.fully_sharded._helpers import (
    REGISTER_FORWARD,
    SHARD,
    shard_code,
)
from autoaccel.convert.transforms.fully_sharded._sharded import given_to_shard
from autoaccel.cst_edit import code_of, first_line_of

_PARAMETERS = ("parameters", "named_parameters")
# Methods that leave a module's parameters where they are (a sharded model takes them).
_KEEPS_MODULE = frozenset({*_PARAMETERS, "load_state_dict", "state_dict", "train", "eval"})


class ShardModel(DistributedStep):
    DESCRIPTION = "Shard the trained model(s) with FSDP2's fully_shard."
    code = "fsdp"

    def visit_Module(self, node: cst.Module) -> None:
        sharded = given_to_shard(node)
        placed, moved_away = placed_models(self, node, _shards_in_caller)
        models = [model for model in placed if model.key not in sharded]
        if not models and not moved_away and not sharded and self.train_loops():
            self.skipped(
                "fully_shard",
                "no trained model was recognised in this training loop, so nothing is sharded"
                " and every process trains its own copy; call `fully_shard` on the model by hand",
                self.train_loops()[0],
                wrong=True,
            )
        shardable = [model for model in models if not self._refused(node, model)]
        self._blocks: set[cst.If] = set()  # the `if DISTRIBUTED:` blocks this step wrote
        methods = {model.key: self._forward_methods(node, model.key) for model in shardable}
        for model in shardable:
            self._shard(model, methods[model.key])
        if shardable:
            code, imports = shard_code(self.options, any(methods.values()))
            self.define_helper(node, SHARD, code)
            self.imports.append(imports)
            self.needs_torch = True  # `shard_model()` reads `torch.nn`

    def _shard(self, model: TrainedModel, methods: list[str]) -> None:
        """Shard after `model.anchor`, the optimizers built before it moving after the
        sharding; or, where the statements from the first optimizer on only load a state
        into the model, just before that optimizer. The model's other forward `methods`
        are registered with it."""
        moved = self._optimizers_built_before(model)
        anchor = model.anchor
        registered = "".join(
            f'    {REGISTER_FORWARD}({model.key}, "{method}")\n' for method in methods
        )
        code = parse_statements(
            "# sharded with FSDP2 when distributed: each process keeps a share of the\n"
            "# parameters, gradients and optimizer state\n"
            f"if {DISTRIBUTED}:\n"
            f"    {SHARD}({model.key})\n"
            + (
                f"    # {_listed(methods, quote='')} gather{'' if methods[1:] else 's'} the parameters"
                " too, as forward() does\n" + registered
                if methods
                else ""
            )
        )
        self._blocks.add(code[-1])  # type: ignore[arg-type]
        if moved and not self._changes_model_after(model, moved[0]):
            self._join(self.before.setdefault(moved[0], []), code)
            anchor = moved[0]
        elif not moved:
            self._join(self.after.setdefault(anchor, []), code)
        else:
            for statement in moved:
                self.replace[statement] = []
                self.changed(
                    statement,
                    f"optimizer built after `{model.key}` is sharded (it holds the sharded"
                    " parameters)",
                )
            self.after.setdefault(anchor, []).extend(
                code + [s.with_changes(leading_lines=[]) if i else s for i, s in enumerate(moved)]
            )
        self.changed(
            anchor,
            f"`{model.key}` sharded with fully_shard (its repeated blocks, then the whole model)",
        )
        if methods:
            self.changed(
                anchor,
                f"{_listed(methods, model.key)} registered as forward methods of the sharded"
                f" `{model.key}`: they gather its parameters as `forward()` does",
            )

    def _forward_methods(self, module: cst.Module, key: str) -> list[str]:
        """The methods other than `forward` of the model `key`'s class that the training
        runs it through (`self.policy.evaluate(s, a)`), and those the script calls on it
        (under any name that holds it: `agent.policy.act(s)`) that compute with its
        layers, in the order of their first call. (Not a getter such as minGPT's
        `get_block_size()`: registered, it would gather the parameters, a collective, to
        read a number.)"""
        held = {o for o in self.script.held_by(key) if o.kind is Kind.MODULE}
        names = {key} | self.script.names_of(held)
        own = {name for o in held if o.cls is not None for c in o.cls.mro() for name in c.methods}
        methods = list(dict.fromkeys(c.func.attr.value for c in self.trained_methods.get(key, [])))  # type: ignore[attr-defined]
        for call in find(module, cst.Call):
            func = call.func
            if not isinstance(func, cst.Attribute) or func.attr.value in methods:
                continue
            if name_key(func.value) not in names and (
                func.attr.value not in own or held.isdisjoint(self.script.values(func.value))
            ):
                continue
            if not self.script.model_method(call):
                continue
            defined = [
                (obj.cls.method(func.attr.value), obj.cls)
                for obj in self.script.values(func.value)
                if obj.kind is Kind.MODULE and obj.cls is not None
            ]
            if any(f is not None and computes_with_layers(f.node, cls) for f, cls in defined):
                methods.append(func.attr.value)
        return methods

    def _join(self, statements: list[cst.BaseStatement], block: list[cst.BaseStatement]) -> None:
        """Add the sharding `block` to `statements`: its call joins the sharding block
        that ends them, when one does (two models built in one statement: one block)."""
        last = statements[-1] if statements else None
        if not isinstance(last, cst.If) or last not in self._blocks:
            statements.extend(block)
            return
        joined = last.with_changes(
            body=last.body.with_changes(body=[*last.body.body, *block[-1].body.body])  # type: ignore[attr-defined]
        )
        self._blocks.add(joined)
        statements[-1] = joined

    def _changes_model_after(self, model: TrainedModel, start: cst.BaseStatement) -> bool:
        """Whether a statement from `start` to `model.anchor` rebinds the model or calls a
        method of it other than a state load (`model.to(device)`, `model.apply(init)`)."""
        body = list(model.block.body)
        for statement in body[body.index(start) : body.index(model.anchor) + 1]:
            if any(name_key(t.target) == model.key for t in find(statement, cst.AssignTarget)):
                return True
            for call in find(statement, cst.Call):
                if isinstance(call.func, cst.Attribute) and name_key(call.func.value) == model.key:
                    if call.func.attr.value not in _KEEPS_MODULE:
                        return True
        return False

    def _part_run_apart(self, model: TrainedModel) -> tuple[str, cst.Call] | None:
        """A module the model keeps as an attribute (`self.t_net = t_net` of a distiller)
        that the program also calls outside the model's own methods (overhaul-distillation's
        `test(t_net)`): the attribute, and that call."""
        program = self.script.program
        held = {o for o in self.script.held_by(model.key) if o.kind is Kind.MODULE}
        classes = {o.cls for o in held if o.cls is not None}
        if program is None or len(classes) != 1:
            return None
        (cls,) = classes
        own = {function.node for c in cls.mro() for function in c.methods.values()}
        parts: dict[Obj, str] = {}
        for c in cls.mro():
            for function in c.methods.values():
                for attribute, value in attribute_assignments(function.node.body):
                    for obj in program.values_of(value, c.module):
                        if obj.kind is Kind.MODULE and obj not in held:
                            parts.setdefault(obj, f"self.{attribute}")
        for call in program.calls:
            module = program.module_of.get(call)
            caller = program.function_of.get(call)
            if module is None or (caller is not None and caller.node in own):
                continue
            for obj in program.values_of(call.func, module) & parts.keys():
                return parts[obj], call
        return None

    def _optimizers_built_before(self, model: TrainedModel) -> list[cst.BaseStatement]:
        """The statements up to `model.anchor` that build an optimizer: from the model's
        parameters, or through a function of the project that does (minGPT's
        `self.optimizer = model.configure_optimizers(config)`). (The anchor of a model a
        function receives is the last statement before its loop, which may build it.) A
        definition builds nothing where it stands (`def count_parameters(model)` reads
        `model.parameters()` when called)."""
        body = list(model.block.body)
        return [
            statement
            for statement in body[: body.index(model.anchor) + 1]
            if not isinstance(statement, (cst.FunctionDef, cst.ClassDef))
            and any(
                _parameters_of(call, model.key)
                or any(obj.kind is Kind.OPTIMIZER for obj in self.script.values(call))
                for call in find(statement, cst.Call)
            )
        ]

    def _refused(self, module: cst.Module, model: TrainedModel) -> bool:
        """Log why `model` cannot be sharded right (and return True), if it cannot."""
        moved = self._optimizers_built_before(model)
        body = list(model.block.body)
        if moved and self._changes_model_after(model, moved[0]):
            bound = {name_key(t.target) for s in moved for t in find(s, cst.AssignTarget)}
            between = body[body.index(moved[0]) + 1 : body.index(model.anchor) + 1]
            user = next(
                (
                    s
                    for s in between
                    if s not in moved and any(name_key(n) in bound for n in find(s, cst.Name))
                ),
                None,
            )
            if user is not None:
                last = "this line" if user is model.anchor else f"`{first_line_of(model.anchor)}`"
                return self._refuse(
                    user,
                    f"this uses the optimizer of `{model.key}` before the model is ready to"
                    f" shard ({last} still changes the model after the optimizer is built: a"
                    " load, a move or a cast); build the optimizer after every change to the"
                    " model, then convert",
                )
        held = self.script.held_by(model.key)
        for cls in {o.cls for o in held if o.kind is Kind.MODULE and o.cls is not None}:
            forward = cls.method("forward")
            program = self.script.program
            made = _returned_distribution(forward, program) if forward is not None else None
            if made is not None and _holds_parameters(cls, program):
                return self._refuse(
                    model.anchor,
                    f"`{cls.name}.forward` returns `{code_of(made)}`, a distribution and no"
                    " tensor: FSDP reduces a sharded model's gradients through hooks on the"
                    " tensors its forward returns, so its parameters would never get any;"
                    " return the distribution's tensors from `forward` and build it outside,"
                    " then convert",
                )
        apart = self._part_run_apart(model)
        if apart is not None:
            part, call = apart
            here = self.script.program.module_of.get(call) is self.script.module  # type: ignore[union-attr]
            return self._refuse(
                call if here else model.anchor,
                f"`{code_of(call)}` runs `{part}` of `{model.key}` on its own"
                + ("" if here else f" ({where(self.script.program.module_of[call], call)})")  # type: ignore[union-attr]
                + f": sharded with `{model.key}`, its parameters are shards outside"
                f" `{model.key}`'s forward (mixed Tensor and DTensor); run it through"
                f" `{model.key}` or leave it out of the model, then convert",
            )
        received = self._received(model)
        if received is not None:
            return self._refuse(
                model.anchor,
                f"{received}; call `fully_shard({model.key})` once where it is built, before"
                " its optimizer is, then convert",
            )
        after = body[body.index(model.anchor) + 1 :]
        places = [(node, model.key) for node in [*after, *self.train_code()]]
        # The model under other names: `net` of `def export(net)` called as `export(model)`.
        places += [
            (code, key)
            for code, key in self.script.holders(self.script.held_by(model.key))
            if key != model.key
        ]
        for node, key in places:
            for attribute in find(node, cst.Attribute):
                if attribute.attr.value == "data" and _reads_parameter(attribute.value, key, node):
                    return self._refuse(
                        attribute,
                        f"this reads a parameter's tensor of `{model.key}` (`.data`), which"
                        " FSDP shards over the processes (a DTensor); read it before sharding"
                        " or through `.full_tensor()` by hand",
                    )
            for call in find(node, cst.Call):
                if (
                    "torch.save" in self.qualified_names(call.func)
                    and call.args
                    and name_key(call.args[0].value) == key
                ):
                    return self._refuse(
                        call,
                        f"this pickles the whole `{model.key}`, whose parameters FSDP shards"
                        f" over the processes; save `{model.key}.state_dict()` instead, then"
                        " convert",
                    )
        return False

    def _received(self, model: TrainedModel) -> str | None:
        """Why `model` cannot be sharded in the function that receives it as a parameter
        (`train_epoch(loader, model, criterion, optimizer)`), or as an attribute of `self`
        that another module builds (ncf's `Engine.train_an_epoch()` trains the `self.model`
        of a subclass's `__init__`), where its callers could not be followed to shard it
        where they build it: a call of it runs in a loop (it would be sharded again at each
        call), or it steps an optimizer it receives or that its class builds elsewhere
        (before the call, holding the parameters as they were before sharding). None if it
        can."""
        program = self.script.program
        function = self.scope_of(model.anchor)
        info = program.functions.get(function) if program and function else None
        built = self._built_elsewhere(model.key)
        if info is None or model.key not in info.positional and built is None:
            return None
        name = f"`{info.name}()`"
        receives = f"receives `{model.key}`" if built is None else f"trains `{model.key}`, {built},"
        for site in program.calls_of(info):  # type: ignore[union-attr]
            caller = program.module_of[site]  # type: ignore[union-attr]
            for ancestor in caller.index.ancestors(site):
                if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                    break
                if isinstance(ancestor, (cst.For, cst.While)):
                    return (
                        f"{name} {receives} and is called in a loop of"
                        f" {Path(caller.path or caller.name).name}, so `fully_shard` there would"
                        " shard the sharded model again at each call"
                    )
        if built is not None:
            bound = {name_key(t.target) for t in find(info.node, cst.AssignTarget)}
            elsewhere = sorted(k for k in self.script.optimizers if k.startswith("self."))
            if elsewhere and not bound.intersection(elsewhere):
                return (
                    f"{name} {receives} and steps `{elsewhere[0]}`, built before"
                    " from the parameters as they are before sharding"
                )
        for step in method_calls(info.node.body, "step"):
            optimizer = name_key(step.func.value)  # type: ignore[attr-defined]
            if optimizer in self.script.optimizers and optimizer in info.positional:
                return (
                    f"{name} receives `{model.key}` and steps the optimizer `{optimizer}` its"
                    " caller built from the parameters as they are before sharding"
                )
        return None

    def _built_elsewhere(self, key: str) -> str | None:
        """Where the model `key`, an attribute of `self` this module never assigns, is
        built in another module (a subclass's `__init__` sets it, then the base class's
        builds the optimizer), as `_built_at` words it; None for any other model."""
        module = self.script.module
        if (
            module is None
            or not key.startswith("self.")
            or any(name_key(t.target) == key for t in find(module.tree, cst.AssignTarget))
        ):
            return None
        made = sorted(
            {
                _built_at(o.module, o.node)
                for o in self.script.held_by(key)
                if o.kind is Kind.MODULE and o.module is not self.script.module
            }
        )
        return f"built by {' and '.join(made)}" if made else None

    def _refuse(self, node: cst.CSTNode, reason: str) -> bool:
        self.skipped("fully_shard", reason, node, wrong=True)
        return True


def _shards_in_caller(handover: Handover) -> bool:
    """Shard where the caller builds the model when the function that receives it runs
    once per epoch (it would shard it again), or after the caller built the model's
    optimizer (which would hold the unsharded parameters)."""
    return handover.in_loop or handover.optimized


def _built_at(module: SourceModule, node: cst.CSTNode) -> str:
    """The statement of `module` that makes `node`, with its function and file, as in
    "`self.model = GMF(config)` in `GMFEngine.__init__()` (gmf.py)" (not a line number:
    the lines of a module the conversion rewrites move)."""
    ancestors = list(module.index.ancestors(node))
    statement = next((a for a in ancestors if isinstance(a, cst.SimpleStatementLine)), node)
    scopes = [a.name.value for a in ancestors if isinstance(a, (cst.FunctionDef, cst.ClassDef))]
    scope = f" in `{'.'.join(reversed(scopes))}()`" if scopes else ""
    return f"`{code_of(statement).strip()}`{scope} ({Path(module.path or module.name).name})"


def _listed(methods: list[str], key: str = "", quote: str = "`") -> str:
    """`decode()`, or `model.encode()` and `model.decode()` with the model's `key`."""
    named = [f"{quote}{key + '.' if key else ''}{method}(){quote}" for method in methods]
    return " and ".join(filter(None, [", ".join(named[:-1]), named[-1]]))


def _reads_parameter(value: cst.BaseExpression, key: str, scope: cst.CSTNode) -> bool:
    """Whether `value` (of `value.data`) is a parameter of the model `key`: an attribute
    of it (`model.fc.weight`), or the variable of a loop over its parameters."""
    root = value
    while isinstance(root, (cst.Attribute, cst.Subscript)):
        if name_key(root) == key:
            return True
        root = root.value
    if name_key(root) == key:
        return value is not root
    if not isinstance(root, cst.Name):
        return False
    return any(
        _parameters_of(loop.iter, key)
        and root.value in {n.value for n in find(loop.target, cst.Name)}
        for loop in find(scope, cst.For)
    )


def _parameters_of(node: cst.CSTNode, key: str) -> bool:
    """`key.parameters()` or `key.named_parameters()`."""
    method = node.func if is_method_call(node, *_PARAMETERS) else None  # type: ignore[attr-defined]
    return method is not None and name_key(method.value) == key


def _returned_distribution(
    function: FunctionInfo, program: Program | None, depth: int = 2
) -> cst.Call | None:
    """The `torch.distributions` object `function` returns (alone or in a tuple), made in
    the `return` or bound to a name before it (`return Normal(mu, sigma), q`), or made by
    a submodule it calls and returns from (`q = self.encoder(x)`, pytorch-vae's modules
    given to the model), `depth` calls deep."""
    index = function.module.index

    def made_by(value: cst.BaseExpression | None) -> cst.Call | None:
        if _distribution(value, index):
            return value  # type: ignore[return-value]
        if depth == 0 or program is None or not isinstance(value, cst.Call):
            return None
        for obj in program.values_of(value.func, function.module):
            forward = obj.cls.method("forward") if obj.cls is not None else None
            inner = _returned_distribution(forward, program, depth - 1) if forward else None
            if inner is not None:
                return inner
        return None

    made: dict[str, cst.Call] = {}
    own = [n for n in find(function.node.body, (cst.Assign, cst.Return)) if _own(n, function)]
    for assign in (n for n in own if isinstance(n, cst.Assign)):
        distribution = made_by(assign.value)
        if distribution is None:
            continue
        for target in assign.targets:
            if isinstance(target.target, cst.Name):
                made[target.target.value] = distribution
    for returned in (n for n in own if isinstance(n, cst.Return)):
        for item in tuple_items(returned.value) if returned.value is not None else ():
            kept = made.get(item.value) if isinstance(item, cst.Name) else None
            found = kept or made_by(item)
            if found is not None:
                return found
    return None


# torch.nn layers with parameters of their own (the ones `shard_model` leaves to the root
# when they are not blocks of a ModuleList or Sequential).
_LAYERS = frozenset(
    f"torch.nn.{name}"
    for name in (
        "Parameter Linear Bilinear Conv1d Conv2d Conv3d ConvTranspose1d ConvTranspose2d"
        " ConvTranspose3d Embedding EmbeddingBag LSTM GRU RNN LSTMCell GRUCell RNNCell"
        " BatchNorm1d BatchNorm2d BatchNorm3d LayerNorm GroupNorm MultiheadAttention PReLU"
    ).split()
)


def _holds_parameters(cls: ClassInfo, program: Program | None) -> bool:
    """Whether the root of the model `cls` holds parameters once `shard_model` has sharded
    the blocks of its ModuleLists and Sequentials: a layer, a parameter or a module of the
    project set as an attribute of its own (rollout_rounds' `Policy`, whose layers are all
    in a Sequential, returns a distribution and trains under FSDP)."""
    for c in cls.mro():
        index = c.module.index
        for assign in find(c.node, cst.Assign):
            if not any(isinstance(t.target, cst.Attribute) for t in assign.targets):
                continue
            value = assign.value
            if not isinstance(value, cst.Call):
                continue
            names = index.qualified_names(value.func)
            made = program.values_of(value, c.module) if program is not None else set()
            if names & _LAYERS or any(o.cls is not None and o.cls.is_module for o in made):
                return True
        if program is not None and _given_modules(c, program):
            return True
    return False


_CONTAINERS = frozenset({"torch.nn.Sequential", "torch.nn.ModuleList"})


def _given_modules(cls: ClassInfo, program: Program) -> bool:
    """Whether `cls`'s `__init__` keeps a module it is given (`self.encoder = encoder`),
    one that is no ModuleList or Sequential: the root holds its parameters."""
    init = cls.method("__init__")
    if init is None or init.cls is not cls:
        return False
    for assign in find(init.node.body, cst.Assign):
        if isinstance(assign.value, cst.Name) and any(
            isinstance(t.target, cst.Attribute) for t in assign.targets
        ):
            for obj in program.values_of(assign.value, cls.module):
                made_by = obj.node.func if isinstance(obj.node, cst.Call) else None
                container = made_by is not None and bool(
                    obj.module.index.qualified_names(made_by) & _CONTAINERS
                )
                if obj.kind is Kind.MODULE and not container:
                    return True
    return False


def _own(node: cst.CSTNode, function: FunctionInfo) -> bool:
    """Whether `node` belongs to `function` itself, not to a function defined in it."""
    index = function.module.index
    inner = next(
        (a for a in index.ancestors(node) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None
    )
    return inner is function.node


def _distribution(value: cst.BaseExpression | None, index) -> bool:
    """A call that makes a `torch.distributions` object."""
    return isinstance(value, cst.Call) and any(
        name.startswith("torch.distributions.") for name in index.qualified_names(value.func)
    )
