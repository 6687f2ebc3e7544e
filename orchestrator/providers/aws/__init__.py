"""The AWS provider: EC2 instances (`provider`), launch requests (`launch`), the network and
security group (`network`) and the GPU catalog (`catalog`)."""

__all__ = ["catalog", "launch", "network", "provider"]
