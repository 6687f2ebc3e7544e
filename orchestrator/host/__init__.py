"""The controller host: one always-on machine that runs the controllers of this ORCH_HOME's
jobs, so that a job outlives the laptop that submitted it.

Pure parts (`layout`, `autostop`, `submission`, `unanswered`) build the scripts, paths and
decisions; the I/O parts (`record`, `wheel`, `session`, `lifecycle`, `remote_jobs`, `handover`,
`kit_archive`, `replacement`, `daemon`, `leftovers`) act on them. What a host answers is data:
job ids are checked (`record.checked_job_id`), kits read bounded (`kit_archive`). See
docs/controller-host.md.
"""
