"""Deadline-aware market choice: the spot policies, their inputs, the live driver, the restart
overhead, and the offline simulator and its sweep. Pure except the driver; never imports the
ledger or a provider's I/O."""

__all__ = ["driver", "inputs", "policies", "restart_overhead", "simulate", "sweep"]
