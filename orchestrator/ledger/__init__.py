"""The ledger: every job, node lease, event and checkpoint record (`store`), and its
consistency check (`check`)."""

__all__ = ["check", "store"]
