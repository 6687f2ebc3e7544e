"""What the tests share: running `orch`, waiting, the ledger, node fixtures and the long trials.

- `helpers`: run `orch` as a process, its environment, wait for a job's state, clean nodes.
- `waiting`: the one poller (`wait_until`) every test waits with.
- `leak_checks`: nothing left behind (processes, namespaces, leases, ledger problems).
- `crash_trials`, `sandbox_crash_trials`: controller kills at random moments on local nodes and
  on `orch sandbox aws` (also `python -m tests.support.crash_trials`, the soak); what both
  share is in `kill_trials`.
- `checkpoint_nodes`, `sandbox_run`, `ledger_load`, `doc_blocks`: fixtures of single suites.
"""
