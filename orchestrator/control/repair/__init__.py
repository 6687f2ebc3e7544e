"""Ledger repair: the world set right by the ledger (`orch reconcile`), and jobs rebuilt from
what outlived their ledger."""
