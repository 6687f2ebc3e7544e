"""The controller processes: one per job (`control/daemon.py`), found by its lock, revived when
it died, holding its lease on a shared ledger, proving whose nodes are whose, adopting jobs
whose controller is gone."""
