"""The functions a `--to fsdp` result defines after its set-up block, and their imports.

Each works in a plain single-process run too: a model that `fully_shard` did not
shard (not an `FSDPModule`) is saved and loaded as before.
"""

from __future__ import annotations

from autoaccel.convert.log import ConvertOptions

SHARD = "shard_model"
REGISTER_FORWARD = "register_fsdp_forward_method"
FULL_STATE = "full_state_dict"
FULL_STATE_EVERYWHERE = "full_state_dict_everywhere"
LOAD_FULL_STATE = "load_full_state_dict"
FULL_OPTIMIZER_STATE = "full_optimizer_state_dict"
LOAD_FULL_OPTIMIZER_STATE = "load_full_optimizer_state_dict"
# The helpers that gather shards: every process must call them.
COLLECTIVES = (FULL_STATE, FULL_STATE_EVERYWHERE, FULL_OPTIMIZER_STATE)


def shard_code(options: ConvertOptions, forward_methods: bool = False) -> tuple[str, str]:
    """`shard_model()` for these options, and the import it needs (with
    `register_fsdp_forward_method` where a model's other `forward_methods` are registered).
    For a model on a GPU: bf16 compute with fp32 gradient reduction unless `--amp off` (the
    whole model's outputs cast back to fp32, as autocast leaves a loss and as `.numpy()`
    needs: siamese-pytorch's evaluation, ninth unseen set), and
    with `--cpu-offload` the shards kept on the CPU between uses (both need an accelerator:
    a model on the CPU trains in fp32, as autocast leaves it on a CPU)."""
    policies, names = [], ["fully_shard"]
    if forward_methods:
        names.append(REGISTER_FORWARD)
    if options.amp != "off":
        names.append("MixedPrecisionPolicy")
        policies.append(
            "        # bf16 compute, fp32 gradient averaging\n"
            '        policies["mp_policy"] = MixedPrecisionPolicy(\n'
            "            param_dtype=torch.bfloat16, reduce_dtype=torch.float32\n"
            "        )\n"
        )
    if options.cpu_offload:
        names.append("CPUOffloadPolicy")
        policies.append(
            "        # parameters, gradients and optimizer state on the CPU between uses\n"
            '        policies["offload_policy"] = CPUOffloadPolicy()\n'
        )
    on_gpu = (
        "    if any(parameter.is_cuda for parameter in model.parameters()):\n" + "".join(policies)
        if policies
        else ""
    )
    root_outputs = (
        '    if "mp_policy" in policies:  # the model\'s outputs in fp32: its loss, `.numpy()`\n'
        '        policies["mp_policy"] = MixedPrecisionPolicy(\n'
        "            param_dtype=torch.bfloat16,\n"
        "            reduce_dtype=torch.float32,\n"
        "            output_dtype=torch.float32,\n"
        "        )\n"
        if options.amp != "off"
        else ""
    )
    code = f'''
def {SHARD}(model):
    """FSDP2: each process keeps 1/WORLD_SIZE of the parameters, gradients and optimizer
    state. Each repeated block (a child of the outermost ModuleLists and Sequentials,
    e.g. transformer layers) gathers its parameters only while it computes; the root
    holds the rest. Every process starts from rank 0's values, as under DDP (a model
    built after a per-process seed would otherwise start from a different draw)."""
    if torch.distributed.is_initialized():
        for tensor in [*model.parameters(), *model.buffers()]:
            torch.distributed.broadcast(tensor.data, src=0)
    policies = {{}}
{on_gpu}    containers = [model]
    while containers:
        module = containers.pop()
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            for block in module:
                if any(True for _ in block.parameters()):
                    fully_shard(block, **policies)
        else:
            containers.extend(module.children())
{root_outputs}    fully_shard(model, **policies)
'''
    return code, f"from torch.distributed.fsdp import {', '.join(sorted(names))}"


# Saving: every process takes part in gathering; only rank 0 receives the tensors (on
# its CPU), which it saves. Loading: rank 0's state dict is sent to every process, each
# keeping its shard (the others' may be empty). A forward pass without backward (an
# evaluation) leaves the root's parameters gathered: `reshard()` first.
STATE_CODE = {
    FULL_STATE: f'''
def {FULL_STATE}(model):
    """`model.state_dict()`, whole: under FSDP every process must call this, and rank 0
    gets the tensors on its CPU (the other processes get {{}})."""
    if isinstance(model, FSDPModule):
        model.reshard()  # an evaluation may have left it gathered
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return model.state_dict()
''',
    FULL_STATE_EVERYWHERE: f'''
def {FULL_STATE_EVERYWHERE}(model):
    """`model.state_dict()`, whole, on every process (which must all call this): for a
    copy into a model that is not sharded, as a target network's."""
    if isinstance(model, FSDPModule):
        model.reshard()  # an evaluation may have left it gathered
        options = StateDictOptions(full_state_dict=True)
        return get_model_state_dict(model, options=options)
    return model.state_dict()
''',
    LOAD_FULL_STATE: f'''
def {LOAD_FULL_STATE}(model, state_dict, strict=True):
    """`model.load_state_dict(state_dict)` of a whole state dict; under FSDP every
    process must call this, and rank 0's `state_dict` is the one loaded."""
    if isinstance(model, FSDPModule):
        model.reshard()  # an evaluation may have left it gathered
        options = StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True, strict=strict
        )
        return set_model_state_dict(model, state_dict, options=options)
    return model.load_state_dict(state_dict, strict=strict)
''',
    FULL_OPTIMIZER_STATE: f'''
def {FULL_OPTIMIZER_STATE}(model, optimizer):
    """`optimizer.state_dict()`, whole (keyed by parameter names under FSDP): every
    process must call this, and rank 0 gets the tensors on its CPU."""
    if isinstance(model, FSDPModule):
        model.reshard()  # an evaluation may have left it gathered
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(model, optimizer, options=options)
    return optimizer.state_dict()
''',
    LOAD_FULL_OPTIMIZER_STATE: f'''
def {LOAD_FULL_OPTIMIZER_STATE}(model, optimizer, state_dict):
    """`optimizer.load_state_dict(state_dict)`; under FSDP every process must call this,
    and rank 0's `state_dict` is the one loaded."""
    if isinstance(model, FSDPModule):
        model.reshard()  # an evaluation may have left it gathered
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_optimizer_state_dict(model, optimizer, state_dict, options=options)
    else:
        optimizer.load_state_dict(state_dict)
''',
}
