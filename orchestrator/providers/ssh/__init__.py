"""The SSH fleet provider: jobs on machines the user already has (a fleet recorded with
`orch fleet add`), reached over SSH with the user's own key. Each node of a job is an
allocation of some slots (GPUs, or processes on a CPU host) of one host of the fleet;
`placement` decides which (pure), the ledger (`ledger.fleets`) records who holds what."""
