"""The local provider: nodes as network namespaces with a real sshd on this machine
(`provider`, `host`, `net`, `state`), their spot market (`spot`, `chaos`) and power-off
(`poweroff`)."""

__all__ = ["chaos", "host", "net", "poweroff", "provider", "spot", "state"]
