"""The job spec: its models (`model`), their value types (`values`) and placement fields
(`placement`), reading it from YAML with overrides (`loading`), SkyPilot task files read
as specs (`skypilot`), and the shape of a job id (`ids`)."""

__all__ = ["ids", "loading", "model", "placement", "skypilot", "values"]
