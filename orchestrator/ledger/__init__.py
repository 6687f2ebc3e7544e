"""The ledger: every job, node lease, event and checkpoint record (`store`), kept clusters
(`clusters`), what rows measure (`measures`: costs, autostop), a read-only sqlite3 view for the
list views (`view`), and its consistency check (`check`)."""

__all__ = ["check", "clusters", "measures", "store", "view"]
