"""I/O on a running cluster over SSH: its connections, the run watch, GPU and activity watch,
spot-notice watch, node logs, and checkpoints (`cluster.checkpoints`).

Built on `remote/` (SSH and rsync) and on the parsers of `node/`; knows no cloud."""

__all__ = [
    "activity", "checkpoints", "connections", "gpu_watch", "log_files", "log_lines",
    "notice_watch", "run_watch",
]  # fmt: skip
