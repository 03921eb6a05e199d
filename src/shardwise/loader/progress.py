"""A progress bar for one epoch of a loader, on rank 0 only when a process group is up."""

from __future__ import annotations

from typing import Any

import torch.distributed as torch_dist


class EpochBar:
    """Batches done out of the epoch's, on standard error; a summary line when it ends."""

    def __init__(self, total: int | None, epoch: int | None) -> None:
        # rich is imported only when a bar is asked for: `import shardwise` stays light.
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        rank = torch_dist.get_rank() if torch_dist.is_available() and torch_dist.is_initialized() else 0
        self._progress = Progress(
            TextColumn("[progress.description]{task.description}"), BarColumn(),
            MofNCompleteColumn(), TimeRemainingColumn(), console=Console(stderr=True),
            disable=rank != 0, transient=True,
        )
        label = "epoch" if epoch is None else f"epoch {epoch}"
        self._task = self._progress.add_task(label, total=total)
        self._progress.start()

    def advance(self) -> None:
        self._progress.advance(self._task)

    def close(self, summary: Any = None) -> None:
        """Take the bar down (its refresh thread stops), with a ``summary`` line if given."""
        if not self._progress.live.is_started:
            return
        self._progress.stop()
        if summary is not None and not self._progress.disable:
            self._progress.console.print(str(summary), highlight=False)
