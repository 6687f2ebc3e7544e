"""The job spec: its models (`model`) and reading it from YAML with overrides (`loading`)."""

__all__ = ["loading", "model"]
