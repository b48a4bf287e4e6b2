"""N1 of the sixth unseen set (Proxy-Anchor): fixtures/ddp/sampler_in_branch.py makes its
training loader with a batch sampler under `if args.ipc:` and a plain shuffling one
otherwise. The whole conversion was refused for the branch with the sampler; now the
plain loader is sharded and the refusal is left to the proof, which runs the branch the
arguments choose (tests/test_convert_verify.py proves the default one)."""

from __future__ import annotations

from autoaccel.convert.log import DIFFERENT_DATA, ConvertOptions
from autoaccel.convert.pipeline import convert_source
from running import FIXTURES_DIR

FIXTURE = FIXTURES_DIR / "ddp" / "sampler_in_branch.py"


def test_the_plain_loader_is_sharded_and_the_sampler_branch_left_to_the_proof():
    conversion = convert_source(
        FIXTURE.read_text(), ConvertOptions(target="ddp", amp="off"), FIXTURE.name
    )
    assert "DistributedSampler(data, shuffle=True) if DISTRIBUTED else None" in conversion.converted
    (skip,) = [s for s in conversion.log.skipped if s.wrong]
    assert skip.proof == DIFFERENT_DATA and "made under a condition, `loader`" in skip.reason
