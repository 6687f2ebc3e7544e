"""Deadline-aware market choice: the spot policies, their inputs, the live driver, the restart
overhead, and the offline simulator (one zone or several) and its sweeps. Pure except the
driver; never imports the ledger or a provider's I/O."""

__all__ = [
    "driver",
    "inputs",
    "optimal",
    "optimal_zones",
    "policies",
    "restart_overhead",
    "simulate",
    "sweep",
    "zone_choice",
    "zone_sweep",
    "zones",
]
