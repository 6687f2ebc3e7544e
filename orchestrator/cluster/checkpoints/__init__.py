"""Checkpoints of a running job: the nodes' agents (`keeper`), collection from every node
(`collector`), what makes a unit whole (`units`), the local mirror (`mirror`), the ledger's
records (`records`), the object store (`store`) and what the store keeps (`retention`)."""

__all__ = ["collector", "keeper", "mirror", "records", "retention", "store", "units"]
