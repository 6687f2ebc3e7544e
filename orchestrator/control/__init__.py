"""A job's life: the runner (state machine) and its daemon, the supervision of controllers,
reconcile, the commands the CLI shows (submit, down in `commands`; `cancel`), and the pure
rules of stopping, recovering and owning nodes.

Control drives the other wings: it asks `providers/` for machines, `cluster/` for what runs on
them, and records everything in `ledger/`. Nothing below it imports it."""

__all__ = [
    "cancel", "commands", "daemon", "ownership", "reconcile", "recovery_rules", "runner",
    "spend_guard", "stop_rules", "supervision", "unrecorded",
]  # fmt: skip
