"""Lines the trainer prints on stdout (flushed at once; the orchestrator parses them).

Every rank:
    trainer rank=R world_size=W local_rank=L          at start
    trainer rank=R exit=CODE step=N                    just before exiting (0, or 143 stopped)

Rank 0 only, one compact JSON object per line:
    {"step":N,"epoch":E,"loss":L,"lr":LR,"img_s":X,"total_steps":T}
                                                      every --log-every optimizer steps
    {"event":"resume","step":N,"path":P}              after loading a checkpoint
    {"event":"checkpoint","step":N,"path":P}          after each complete checkpoint
    {"event":"stopped","step":N,"signal":S}           when stopping early; S is SIGTERM or
                                                      SIGUSR1 (received by rank 0), "peer"
                                                      (another rank got it) or "stop-after"
    {"event":"done","step":N}                         after the last step (and its checkpoint)

`step` is the number of optimizer steps done, `total_steps` the number the run ends at (with
the step rate it tells the orchestrator how much work is left); `epoch` is 0-based; `loss` is
the mean over all samples of all ranks since the previous progress line; `img_s` counts images
of all ranks.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from orch_trainer.dist import DistEnv


class Reporter:
    """Prints the lines above for one rank."""

    def __init__(self, env: DistEnv, stream: TextIO | None = None) -> None:
        self.env = env
        self.stream = stream if stream is not None else sys.stdout

    def _print(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def start(self) -> None:
        e = self.env
        self._print(f"trainer rank={e.rank} world_size={e.world_size} local_rank={e.local_rank}")

    def exit(self, code: int, step: int) -> None:
        self._print(f"trainer rank={self.env.rank} exit={code} step={step}")

    def _json(self, record: dict[str, Any]) -> None:
        if self.env.is_main:
            self._print(json.dumps(record, separators=(",", ":")))

    def progress(
        self, *, step: int, epoch: int, loss: float, lr: float, img_s: float, total_steps: int
    ) -> None:
        self._json(
            {
                "step": step,
                "epoch": epoch,
                "loss": round(loss, 6),
                "lr": lr,
                "img_s": round(img_s, 1),
                "total_steps": total_steps,
            }
        )

    def event(self, name: str, **fields: Any) -> None:
        self._json({"event": name, **fields})
