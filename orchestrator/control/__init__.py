"""A job's life: the runner (state machine) and its parts (the attempt on the current nodes,
the launcher, the supervisor of a run, the journal of state changes, the guards, salvage and
ending of nodes), its daemon, the commands the CLI shows (submit, down in `commands`;
`cancel`; the `Jobs` they ask, `jobs`: `local_jobs` here, `host_jobs` on the controller host),
the supervision of controllers, reconcile, and the pure rules of stopping, recovering and
owning nodes.

Control drives the other wings: it asks `providers/` for machines, `cluster/` for what runs on
them, and records everything in `ledger/`. Nothing below it imports it."""

__all__ = [
    "attempt", "cancel", "commands", "daemon", "ending", "guards", "host_jobs", "job_wire", "jobs",
    "journal", "launching", "liveness", "local_jobs", "options", "ownership", "parts", "reconcile",
    "recovery_rules", "runner", "salvage", "spend_guard", "stop_rules", "supervision", "supervisor",
    "unrecorded",
]  # fmt: skip
