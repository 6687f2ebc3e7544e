"""What the CLI's verbs do, apart from showing it: submit, down, cancel, wait, ssh, the checks
before a submit, the end-of-job hook."""
