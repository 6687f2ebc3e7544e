"""A controller host that died is replaced by the next `orch controller up`, and its jobs handed
over to the new one.

- `probe` tells a dead host from a live one: a launched host whose node is gone, stopped (or
  powered itself off) by its provider's word is dead. SSH alone never proves a host dead: one
  that does not answer over SSH while its provider reports it running (or an adopted machine,
  which has no provider) is `unconfirmed`, with why SSH failed and what to do
  (`unanswered`): `orch controller up` refuses to replace it without `--force` (`refusal`),
  since a laptop whose public address changed, or a short network glitch, would otherwise
  end a live host with its ledger, mirror and jobs' controllers.
- `retire` ends what is left of a dead host: a launched one's node is terminated through its
  provider (its billing stops then, if it had not already); an adopted machine is only
  forgotten, since orch did not start it.
- `hand_over` gives the new host the dead host's jobs: their files again, their kits
  (`handover`), and, when the new host's ledger does not know a job (the dead host's ledger
  died with it; no `ledger.url`), the job's rows rebuilt from the kit and its running nodes
  (`control.repair.rebuild`). Its orch then adopts each job on its nodes. A job that cannot be
  driven (no kit, or no node left running) is reported `lost`; its nodes, if any, end when
  their guards' budget lease runs out.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config import Settings
from orchestrator.errors import ControllerHostError, InstancesNotFound, OrchError
from orchestrator.host import handover, machines, unanswered
from orchestrator.host import record as records
from orchestrator.host.layout import orch_command
from orchestrator.host.record import HostRecord
from orchestrator.host.session import HostSession
from orchestrator.job_state import JobState

if TYPE_CHECKING:
    from orchestrator.providers.local.provider import LocalProvider

PROBE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Health:
    """Whether the recorded host is alive, and if not, why it is taken for dead."""

    alive: bool
    reason: str = ""  # e.g. "its node l-0123456789 is gone" ("" when alive)
    # Only SSH failed: its provider reports it running (or it is adopted, with no provider).
    # `up` replaces such a host only with --force; `fix` says what to do instead.
    unconfirmed: bool = False
    fix: str = ""


def probe(settings: Settings, record: HostRecord) -> Health:
    """Whether the host of `record` is alive: its node still there by its provider's word (a
    launched host) and it answers a command over SSH. A host whose `up` never finished (no orch
    folder recorded) counts as dead: what `up` left of it is ended, and a new one set up. One
    that does not answer over SSH but that nothing else says is gone is `unconfirmed`."""
    if not record.root:
        return Health(False, "its setup by `orch controller up` never finished")
    launched = record.kind == "launched" and record.instance_id
    if launched:
        ended_at = machines.self_ended_at(settings, record)
        if ended_at is not None:
            return Health(False, f"its node {record.instance_id} powered off at {ended_at}")
        state = machines.state(settings, record)
        if state != machines.RUNNING:
            return Health(False, f"its node {record.instance_id} is {state}")
    session = HostSession(settings.home, record)
    try:
        session.run("true", timeout=PROBE_TIMEOUT_S)
    except OrchError as exc:
        why = unanswered.explain(exc, on_aws=record.provider == "aws")
        said = (
            f"its provider reports its node {record.instance_id} running"
            if launched
            else "it is an adopted machine: nothing but SSH can tell whether it lives"
        )
        return Health(False, f"it does not answer over SSH ({why.kind}: {why.detail}), but "
                      f"{said}", unconfirmed=True, fix=why.fix)  # fmt: skip
    finally:
        session.close()
    return Health(True)


def what_ends(record: HostRecord) -> str:
    """What replacing the host of `record` ends, said before `up --force` does it."""
    jobs = f"the controllers of its {len(record.jobs)} job(s)"
    if record.kind == "launched" and record.instance_id:
        return (f"its node {record.instance_id} is terminated, and with it the host's orch, "
                f"its own ledger (without `ledger.url`), its checkpoint mirror and {jobs}; "
                "the jobs are handed over to the new host")  # fmt: skip
    return (f"it is forgotten (an adopted machine is not ended: if it lives, stop orch there, "
            f"or its {jobs} drive them too); the jobs are handed over to the new host")  # fmt: skip


def refusal(record: HostRecord, health: Health) -> ControllerHostError:
    """Why `up` leaves the unconfirmed host of `record` (`health`) alone, and what to do."""
    return ControllerHostError(
        f"the controller host {record.user}@{record.host}:{record.port} is not replaced: "
        f"{health.reason}",
        hint=f"{health.fix}. To replace it all the same: `orch controller up --force` "
        f"({what_ends(record)})",
    )


def retire(settings: Settings, record: HostRecord) -> dict[str, Any]:
    """End what is left of the dead host of `record`; returns what was done."""
    done: dict[str, Any] = {"host": f"{record.user}@{record.host}:{record.port}",
                            "kind": record.kind, "terminated": None}  # fmt: skip
    if record.kind == "launched" and record.instance_id and record.provider == "aws":
        ended = machines.self_ended_at(settings, record)
        try:
            stopped = machines.terminate(settings, record)
        except InstancesNotFound as exc:
            stopped = exc.ended_at or datetime.now(UTC)
        done["terminated"] = record.instance_id
        done["billing_stopped_at"] = (ended or stopped).isoformat()
    elif record.kind == "launched" and record.instance_id:
        from orchestrator.providers.local.provider import LocalProvider

        provider = LocalProvider(settings)
        iid = record.instance_id
        powered_off = provider.self_ended([iid]).get(iid)
        ended = powered_off.at if powered_off else _ended_at(provider, iid)
        try:
            stopped = provider.terminate([iid])
        except InstancesNotFound as exc:  # ended already, and its end not kept here
            stopped = exc.ended_at or datetime.now(UTC)
        done["terminated"] = iid
        done["billing_stopped_at"] = (ended or stopped).isoformat()
    return done


def _ended_at(provider: LocalProvider, instance_id: str) -> datetime | None:
    """When the local provider ended a node that is gone already (it keeps one file per ended
    node, written when its processes were gone); None while the node is there."""
    if provider.store.node_dir(instance_id).exists() or not provider.store.was_ended(instance_id):
        return None
    marker = provider.store.ended_dir / instance_id
    return datetime.fromtimestamp(marker.stat().st_mtime, UTC)


def retire_dead(settings: Settings, record: HostRecord, health: Health) -> dict[str, Any]:
    """Before `up`, when `probe` found the host of `record` dead: end what is left of it
    (`retire`), forget it, and return what was done, with `reason` (why it was taken for dead)
    and `jobs` (those it had, for `hand_over_kept`)."""
    done = {**retire(settings, record), "reason": health.reason, "jobs": record.jobs}
    records.forget(settings.home)
    return done


def hand_over_kept(
    settings: Settings, job_ids: list[str], say: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Hand `job_ids` over to this ORCH_HOME's (new) host: they are remembered as its jobs,
    so that `orch status|logs|cancel JOB` ask it, and `hand_over` gives it their kits and
    files. `say` gets a line for each step that takes time."""
    record = records.require(settings.home)
    jobs = list(dict.fromkeys([*record.jobs, *job_ids]))
    records.save(settings.home, dataclasses.replace(record, jobs=jobs))
    session = HostSession(settings.home, record)
    try:
        return hand_over(session, settings.home, job_ids, say)
    finally:
        session.close()


def hand_over(
    session: HostSession,
    home: Path,
    job_ids: list[str],
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Give the new host of `session` what driving `job_ids` takes, and let its orch adopt them.

    For each job: its workdir and data sources, sent again from this machine (`handover.resend`),
    and its kit; then the host writes into its ledger each job it does not know, from the kit
    and the job's running nodes (`orch controller rebuild`, `control.repair.rebuild`): without a
    team
    ledger, the dead host's ledger died with it. The next listing there gives each such job a
    controller, which adopts it on its nodes.

    Returns `handed_over` (unfinished jobs its ledger shows: it drives them, or will once the
    dead host's controller lease has expired), `ended` (jobs its ledger shows finished),
    `rebuilt` (jobs of either kind rebuilt from their nodes), `lost` ({id: why}: jobs it cannot
    drive) and `notes` (what its orch said about them, and files that could not be sent
    again): `hand_over_report`."""
    flag = shlex.quote(session.layout.handover_flag)
    session.run(f"touch {flag}")  # the host is not idle meanwhile: no autostop mid-way
    try:
        return _hand_over(session, home, job_ids, say)
    finally:
        session.run(f"rm -f {flag}", check=False)


def _hand_over(
    session: HostSession, home: Path, job_ids: list[str], say: Callable[[str], None]
) -> dict[str, Any]:
    notes: list[str] = []
    for job_id in job_ids:
        if handover.kit_dir(home, job_id).is_dir():
            try:
                why = handover.resend(session, home, job_id, say)
            except OrchError as exc:  # the job is handed over all the same
                why = f"sending them failed: {exc.message}"
            if why is not None:
                notes.append(f"job {job_id}: a replacement node cannot get its files: {why}")
    sent = set(handover.push(session, home, job_ids))
    rebuilt: dict[str, dict[str, str]] = {}
    if sent:
        say(f"rebuilding {len(sent)} job(s) from their running nodes on the new host")
        answer = session.run(
            orch_command(session.layout, ["controller", "rebuild", "--json", *sorted(sent)]),
            check=False,
        )
        try:
            rebuilt = dict(json.loads(answer.stdout)["jobs"])
        except (ValueError, KeyError, TypeError):
            notes.append(f"the new host could not rebuild jobs: {answer.stderr.strip()[-500:]}")
    listing = session.run(orch_command(session.layout, ["status", "--json"]), check=False)
    try:
        jobs = {str(j["id"]): str(j["state"]) for j in json.loads(listing.stdout)["jobs"]}
    except (ValueError, KeyError, TypeError):
        jobs = {}
    notes += [
        line.strip()
        for line in listing.stderr.splitlines()
        if any(job_id in line for job_id in job_ids)
    ]
    return hand_over_report(job_ids, sent=sent, rebuilt=rebuilt, states=jobs, notes=notes)


def hand_over_report(
    job_ids: list[str],
    *,
    sent: set[str],
    rebuilt: dict[str, dict[str, str]],
    states: dict[str, str],
    notes: list[str],
) -> dict[str, Any]:
    """What became of each of `job_ids` on the new host, from the kits `sent`, what its
    `orch controller rebuild` answered (`rebuilt`: {id: {status, detail}}) and the states its
    ledger lists afterwards (`states`).

    `rebuilt` names every job written from its running nodes, whatever its state now: its
    controller may have adopted it and found it done before the listing (the nodes trained on
    while no host ran). `ended` names those the listing shows finished; `handed_over` the
    others it knows; `lost` ({id: why}) those it does not know or got no kit of."""
    report: dict[str, Any] = {"handed_over": [], "rebuilt": [], "ended": [], "lost": {},
                              "notes": notes}  # fmt: skip
    for job_id in job_ids:
        state = states.get(job_id)
        result = rebuilt.get(job_id, {})
        if state is None:
            report["lost"][job_id] = _why_unknown(result, sent=job_id in sent)
            continue
        if job_id not in sent and not _final(state):
            report["lost"][job_id] = "this ORCH_HOME kept no hand-over kit of it"
            continue
        report["ended" if _final(state) else "handed_over"].append(job_id)
        if result.get("status") == "rebuilt":
            report["rebuilt"].append(job_id)
    return report


def _why_unknown(result: dict[str, str], *, sent: bool) -> str:
    """Why the new host's ledger does not know a handed-over job."""
    if result.get("status") == "lost":
        return result.get("detail") or "it could not be rebuilt from its nodes"
    if not sent:
        return "this ORCH_HOME kept no hand-over kit of it"
    return "the new host's ledger does not know it"


def _final(state: str) -> bool:
    try:
        return JobState(state).is_final
    except ValueError:
        return False
