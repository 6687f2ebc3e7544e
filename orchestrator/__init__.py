"""orch: a cost-aware job orchestrator for distributed PyTorch training."""

__version__ = "0.1.0"
