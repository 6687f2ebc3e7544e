"""The controller host: one always-on machine that runs the controllers of this ORCH_HOME's
jobs, so that a job outlives the laptop that submitted it.

Pure parts (`layout`, `autostop`, `submission`) build the scripts, paths and decisions; the I/O
parts (`record`, `wheel`, `session`, `lifecycle`, `remote_jobs`, `handover`, `replacement`,
`daemon`) act on them. See
docs/controller-host.md.
"""
