"""Documents about jobs (`documents`, the `--json` shapes), the run report (`data`, `render`,
`write`) and the sweep report (`sweep`). The only home of matplotlib."""

__all__ = ["data", "documents", "render", "sweep", "write"]
