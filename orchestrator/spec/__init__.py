"""The job spec: its models (`model`), their value types (`values`) and placement fields
(`placement`), reading it from YAML with overrides (`loading`), and SkyPilot task files read
as specs (`skypilot`)."""

__all__ = ["loading", "model", "placement", "skypilot", "values"]
