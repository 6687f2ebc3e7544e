"""Reference DDP trainer that orch runs on its nodes."""
