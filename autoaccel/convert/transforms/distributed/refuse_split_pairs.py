"""Refuse a training loss that pairs the samples of a batch with each other (a contrastive
loss's in-batch negatives, pairwise distances, mined triplets): each process would pair only
those of its share of the batch, half the negatives on two processes, which is another loss
(an NT-Xent of 16 samples starts at log(31) = 3.43, one of 8 at log(15) = 2.71; the proof's
30% loss tolerance does not tell them apart). `nn.DataParallel` (`--to dp`) refuses alike."""

from __future__ import annotations

import libcst as cst

from autoaccel.analysis.batch_pairs import called_pairing, pairing_in
from autoaccel.cst_edit import code_of
from autoaccel.convert.transforms.distributed._base import DistributedStep

_GATHER = (
    "; gather every process's embeddings before the loss by hand"
    " (`torch.distributed.nn.functional.all_gather`, which passes gradients back)"
)


class RefuseSplitPairs(DistributedStep):
    DESCRIPTION = "Refuse a loss that pairs the samples of a batch with each other."
    reports_only = True

    def visit_Module(self, node: cst.Module) -> None:
        index = self.script.index
        assert index is not None
        for loop in self.train_loops():
            batch = set(self.script.step_loops[loop].batch_names)
            found = pairing_in(loop.body, batch, index)
            if found is not None:
                how, statement = found
                self._refuse(f"this step {how}", statement)
                return
        for call in self.step_calls(node):
            pairing = called_pairing(call, self.script.values(call.func))
            if pairing is not None:
                name, how = pairing
                called = code_of(call.func)
                runs = "" if called.endswith(name) else f" (`{name}`)"
                self._refuse(f"`{called}(...)`{runs} {how}", call)
                return

    def _refuse(self, what: str, node: cst.CSTNode) -> None:
        self.skipped(
            "per-process batches",
            f"{what}: each process would pair only the samples of its share of the batch, so"
            f" the loss would not be the original's{_GATHER}",
            node,
            wrong=True,
        )
