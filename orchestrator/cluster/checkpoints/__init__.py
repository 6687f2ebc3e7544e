"""Checkpoints of a running job: the nodes' agents (`keeper`), collection from every node
(`collector`), what makes a unit whole (`units`), the local mirror (`mirror`), the ledger's
records (`records`), the object store (`store`), what the store keeps (`retention`), when
failed collections end a job (`streak`) and files going without a copy (`capture_alerts`)."""

__all__ = [
    "capture_alerts", "collector", "keeper", "mirror", "records", "retention", "store", "streak",
    "units",
]  # fmt: skip
