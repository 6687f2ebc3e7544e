"""A local cloud for rehearsing `--provider aws` offline: `orch sandbox aws`.

The sandbox is one foreground process that holds:

- moto's EC2 API on 127.0.0.1, behind a small gateway (`gateway`) that adds what moto lacks: a
  spot price table (`pricing`), capacity refusals per zone and market (`capacity`), and a control
  API under `/_sandbox/` that `orch sandbox ...` subcommands use (`client`);
- one region whose default VPC is the sandbox's own network (`network`): a host bridge and one
  subnet per zone, so an instance's private IP is an address the bridge reaches;
- a materializer (`materializer`) that turns every live moto instance into a host (`hosts`): a
  network namespace holding the instance's private IP on `ens5`, a real sshd for the AMI's user
  `ubuntu` that accepts the launched key pair and uses the host key from the user data, a private
  disk as that user's home, and an IMDSv2-style metadata endpoint at 169.254.169.254.

Terminating an instance in moto ends its host; `orch sandbox preempt` reclaims one like EC2 does
with a spot instance (notice first, then terminated with `Server.SpotInstanceTermination`). On
SIGTERM or Ctrl-C everything the sandbox made is removed. The provider modules know nothing of the
sandbox: orch talks to it exactly as to EC2, through `ORCH_AWS_ENDPOINT_URL`.
"""
