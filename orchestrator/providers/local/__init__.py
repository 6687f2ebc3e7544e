"""The local provider: nodes as network namespaces with a real sshd on this machine
(`provider`, `starting`, `host`, `net`, `state`), their spot market (`spot`, `chaos`) and
power-off (`poweroff`, the program; its command is built in `net`).

`kit` is the public surface for code outside the provider that builds hosts the same way (the
sandbox): it imports from there only."""

__all__ = ["chaos", "host", "kit", "net", "poweroff", "provider", "spot", "starting", "state"]
