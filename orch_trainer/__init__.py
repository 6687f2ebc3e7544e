"""Reference DDP trainer that orch runs on its nodes: `python -m orch_trainer.train` (torchrun).

The top-level `trainer` is an equal entry point to the same modules, a namespace package that
never hides a project's own `trainer`; orch runs its trainer by this name, which a project's
`trainer` never shadows (docs/spot.md, "The reference trainer").

It follows the orch trainer contract (see docs in `orch_trainer.train`, `orch_trainer.checkpoint`
and `orch_trainer.report`): checkpoints in `$ORCH_CHECKPOINT_DIR` as atomic `step-NNNNNN/`
folders with a COMPLETE marker and a `latest` pointer, resume from `$ORCH_RESUME_FROM`,
SIGTERM/SIGUSR1 ends the run after the current step and a checkpoint with exit status 143, and
progress as JSON lines on rank 0's stdout.

Modules, one job each:
    train      entry point, exit statuses          args       flags -> TrainConfig
    run        start-up sequence                   loop       steps, logging, saving, stopping
    data       data sets and the DataLoader        sampler    resumable per-rank sample order
    models     tiny CNN, ResNet-18 for 32x32       schedule   LR scaling, warmup, cosine
    checkpoint checkpoint files on disk            state      what a checkpoint holds
    dist       process group helpers               signals    stop requests
    precision  AMP modes                           report     stdout lines
    errors     exceptions (UsageError -> exit 2)
"""
