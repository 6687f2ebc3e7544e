"""The one exception tree of orch.

Every error a user can meet is an `OrchError` whose message says what happened and what to do
next. The CLI maps `exit_code` to the process exit status; library code never calls sys.exit.
"""

from __future__ import annotations

from datetime import datetime


class OrchError(Exception):
    """Root of every error orch raises on purpose. Exit code 1 unless a subclass says otherwise."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  -> {self.hint}" if self.hint else self.message


class SpecError(OrchError):
    """The job spec or the command-line flags are invalid. Nothing was provisioned."""

    exit_code = 2


class ConfigError(OrchError):
    """orch's own configuration (ORCH_HOME/config.yaml, ORCH_* variables) is invalid."""

    exit_code = 2


class TraceError(OrchError):
    """A spot availability trace file is missing or not in the expected format."""

    exit_code = 2


class ProviderError(OrchError):
    """The provider could not give or take back machines (API error, missing privileges)."""

    exit_code = 3


class CapacityError(ProviderError):
    """No offer could be launched: every type, zone and market tried was refused."""


class InstancesNotFound(ProviderError):
    """`terminate` was given ids the provider cannot find at all (not even as ended nodes):
    they belong to another account, region or endpoint, or never existed. The other ids were
    ended; billing of those stopped at `ended_at`."""

    def __init__(
        self,
        message: str,
        *,
        instance_ids: tuple[str, ...],
        ended_at: datetime | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.instance_ids = instance_ids  # the ids not found
        self.ended_at = ended_at  # when billing of the found ones stopped


class IdentityMismatch(OrchError):
    """A controller acting as another cloud identity (account, region, endpoint) than the one
    that started the job was asked to drive it: it refused, and touched nothing."""

    exit_code = 3


class RemoteError(OrchError):
    """A command or transfer on a node failed; `result` carries what the node said."""

    step: str | None = None  # the launch step it failed in, once named (`cluster.steps`)

    def __init__(self, message: str, *, hint: str | None = None, result: object = None) -> None:
        super().__init__(message, hint=hint)
        self.result = result


class NodeUnreachable(RemoteError):
    """A node did not answer over SSH within the timeout (gone, or cut off)."""


class TransferTimeout(RemoteError):
    """A transfer to or from nodes (a push, a restore) did not finish within its timeout and
    was stopped."""


class StreamStalled(NodeUnreachable):
    """A streamed command printed nothing for longer than its idle timeout (hung, or its node
    cut off without the connection noticing yet)."""


class OutputTooLarge(RemoteError):
    """A command on a node printed more than its caller reads (`NodeConnection.run`'s
    `max_output`): reading stopped there and the command was ended; `result` is cut."""


class HostKeyMismatch(RemoteError):
    """A node presented a host key other than the one its provider reported: refused."""


class CheckpointError(OrchError):
    """Checkpoints could not be brought home or put back (the mirror's disk, a node's answer);
    the mirror keeps what it had."""


class JobFailed(OrchError):
    """The job's training command failed on at least one node."""

    exit_code = 1


class ContainerError(OrchError):
    """The job's container image could not be had or run on a node (it does not exist, the
    registry refused the credentials, the node's runtime cannot run it); the job fails and its
    nodes are ended."""


class DataError(OrchError):
    """A job's data could not reach its nodes, or its outputs could not leave them: a bucket
    or prefix missing, no permission, a local path gone, a disk too small. The message names
    the source and the node; the job's nodes are ended."""


class NodeLost(JobFailed):
    """A node of a running job stopped answering on several checks in a row."""

    def __init__(self, rank: int, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.rank = rank


class BudgetExceeded(OrchError):
    """The job was stopped because it reached its spending cap."""

    exit_code = 4


class BudgetRefused(BudgetExceeded):
    """A submit's planned cost does not fit in what a monthly budget (`budget.monthly_usd`,
    `budget.user_monthly_usd`) has left; nothing was registered or launched."""


class JobCancelled(OrchError):
    """The job was cancelled by the user (Ctrl-C or `orch cancel`)."""

    exit_code = 130


class UnknownJob(OrchError):
    """No job with that id exists in the ledger."""

    exit_code = 2


class LedgerError(OrchError):
    """The ledger refused writes (disk full, locked too long, read-only); nodes were still
    ended, and what could not be written waits under ORCH_HOME/unrecorded/."""


class ControllerHostError(OrchError):
    """The controller host could not be set up, reached or stopped; the message says which step
    failed and the hint what to do (`orch controller status` shows what is known of it)."""

    exit_code = 3


class FleetFull(CapacityError):
    """A fleet has no room for a job now; it may later (the job queues unless --no-wait)."""

    def __init__(self, fleet: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(
            message,
            hint=hint
            or f"wait for a job on fleet {fleet} to end (`orch fleet status {fleet}`), or "
            "submit without --no-wait to queue",
        )
        self.fleet = fleet


class FleetError(OrchError):
    """A fleet of the user's own machines (`orch fleet ...`) cannot be used as asked: its name
    is taken or unknown, or it is busy; the message says which and what to do."""

    exit_code = 2


class FleetExists(FleetError):
    """`orch fleet add NAME`: the ledger has a fleet of that name already; nothing recorded."""


class FleetNotFound(FleetError):
    """No fleet of that name in the ledger; the message names the fleets there are."""


class FleetBusy(FleetError):
    """The fleet cannot be removed while a job holds slots of its hosts or waits for them; the
    message names those jobs."""


class HostUnreachable(RemoteError):
    """A machine of a fleet did not answer over SSH (refused, timed out, no route, or its
    jump host could not reach it); the message names the machine and the reason."""

    exit_code = 3


class HostAuthFailed(RemoteError):
    """A machine of a fleet refused the identity (the key is not in the login's
    authorized_keys, or could not be read)."""

    exit_code = 3


class FleetHostsFailed(RemoteError):
    """`orch fleet add`: some machines could not be probed; each is named with its reason and
    nothing was recorded."""

    exit_code = 3
