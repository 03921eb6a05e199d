"""What Lightning's spawned ranks need from a test: leaving their process group together."""

import lightning
import torch

from shardwise.distributed.launch import _leave_group


class LeaveTheGroupTogether(lightning.Callback):
    """Ranks leave their gloo group side by side, while their interpreters are whole.

    Left to Lightning's exit hook, each spawned rank tears the group down alone as its
    interpreter shuts down; now and then one aborted there ("terminate called without an active
    exception", SIGABRT), after the test's work was done and checked.
    """

    def on_fit_end(self, trainer: "lightning.Trainer", module: "lightning.LightningModule") -> None:
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
            _leave_group()  # what shardwise's own ranks do: collect, then destroy the group
