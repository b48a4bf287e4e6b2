"""F1 of the sixth unseen set (RealNVP): fixtures/ddp/flow_loss_module.py, whose optimizer
gets parameter groups a helper collects in a loop, so the code does not say which of the
two modules its step calls trains: the flow or its loss module, which has no parameters.
Each is wrapped in DDP only where it has trainable parameters (DDP raises for a module
without; the wrap asked `next(loss_fn.parameters())` and stopped on StopIteration).
tests/test_convert_verify.py proves the result on two processes."""

from __future__ import annotations

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from running import FIXTURES_DIR

FIXTURE = FIXTURES_DIR / "ddp" / "flow_loss_module.py"


def test_each_module_the_step_calls_is_wrapped_where_it_has_trainable_parameters():
    converted = convert_source(
        FIXTURE.read_text(), ConvertOptions(target="ddp", amp="off"), FIXTURE.name
    ).converted
    for key in ("net", "loss_fn"):
        assert f"    if DISTRIBUTED and any(p.requires_grad for p in {key}.parameters()):\n" in (
            converted
        )
