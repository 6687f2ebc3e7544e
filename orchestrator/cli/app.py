"""The `orch` command line: one function per verb; every read command has --json.

Exit codes: 0 success, 1 job failed, 2 bad input, 3 provider/capacity error, 4 budget cap,
130 cancelled. Library code raises `OrchError`s; only `main` turns them into exit codes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from orchestrator.cli.simulate import simulate_command
from orchestrator.config import Settings, load_settings
from orchestrator.errors import OrchError, SpecError, UnknownJob
from orchestrator.ledger.store import JobState, Ledger, make_engine, utcnow
from orchestrator.providers import get_provider

if TYPE_CHECKING:
    from orchestrator.control.ownership import Partition
    from orchestrator.providers.base import Instance, Provider
    from orchestrator.providers.plan import DryRun, LaunchPlan
    from orchestrator.spec.model import CheckpointSpec, JobSpec

app = typer.Typer(
    name="orch",
    help="Run distributed PyTorch training on cheap cloud nodes, and shut them down after.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JsonFlag = Annotated[bool, typer.Option("--json", help="print one JSON document")]

# A person watches a foreground job: its log and progress are polled every second.
FOREGROUND_WATCH_INTERVAL = 1.0


def _ledger(settings: Settings) -> Ledger:
    return Ledger(make_engine(settings.db_path))


def _kept_where(checkpoint: CheckpointSpec, mirror: Path) -> str:
    places = [] if checkpoint.mirror_mode == "none" else [f"{mirror} ({checkpoint.mirror_mode})"]
    if checkpoint.store:
        places.append(checkpoint.store)
    return " and ".join(places)


def _print_json(document: object) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


def _plan(spec: JobSpec, provider: Provider) -> DryRun:
    """The plan a submit follows (cheapest fitting offer first) and its dry-run document."""
    from orchestrator.spec.requests import launch_request

    return provider.plan(launch_request(spec, spec.name), spec.budget)


def _confirm_spend(spec: JobSpec, plan: LaunchPlan) -> None:
    """Ask before a job without a budget bills a paid provider (`spend_guard`); without a
    terminal to ask on, refuse (SpecError, exit 2). Declined: exit 130, nothing launched."""
    from orchestrator.control.spend_guard import needs_confirmation

    notice = needs_confirmation(spec, plan)
    if notice is None:
        return
    if not sys.stdin.isatty():
        raise SpecError(
            f"{notice.text()}; not launched: there is no terminal to ask on",
            hint="pass --yes to launch anyway, or set a budget: --max-cost USD, "
            "budget.max_runtime in the spec, or controller.default_max_runtime "
            "(ORCH_DEFAULT_MAX_RUNTIME)",
        )
    if not typer.confirm(f"{notice.text()}. Launch?", default=False, err=True):
        Console(stderr=True).print("not launched", highlight=False)
        raise typer.Exit(130)


def _raise_interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


@app.command()
def submit(
    job_file: Annotated[Path, typer.Argument(help="job spec (YAML)", show_default=False)],
    nodes: Annotated[int | None, typer.Option("--nodes", help="number of nodes")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs (processes) per node")] = None,
    provider: Annotated[str | None, typer.Option("--provider", help="local or aws")] = None,
    spot: Annotated[bool | None, typer.Option("--spot/--no-spot", help="spot capacity")] = None,
    max_cost: Annotated[
        str | None, typer.Option("--max-cost", help="hard cap on the job's spend, USD")
    ] = None,
    idle_timeout: Annotated[
        float | None, typer.Option("--idle-timeout", help="seconds of idleness before stopping")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="show the plan, launch nothing")
    ] = False,
    detach: Annotated[
        bool, typer.Option("--detach", help="hand the job to a background controller")
    ] = False,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", "-y", help="launch without asking, even on a paid provider with no budget"
        ),
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Run a job: provision nodes, sync, train, pull checkpoints, shut the nodes down.

    In the foreground this process is the job's controller (Ctrl-C cancels the job); with
    --detach a background controller drives it and the job id is printed on the last line.
    On a paid provider (aws), a job with neither budget.max_cost_usd nor budget.max_runtime
    shows its hourly price and asks first (exit 2 without a terminal; --yes for scripts);
    controller.default_max_runtime gives such jobs a max_runtime instead.
    """
    from orchestrator.control.runner import JobRunner, RunnerOptions
    from orchestrator.control.supervision import (
        ControllerLock,
        new_job_id,
        register_job,
        spawn_controller,
        wait_for_controller,
    )
    from orchestrator.report.documents import job_document
    from orchestrator.spec.loading import load_job

    if dry_run and detach:
        raise SpecError(
            "give --dry-run or --detach, not both",
            hint="--dry-run shows the plan and launches nothing; --detach launches the job",
        )
    settings = load_settings()
    overrides = {
        "resources.nodes": nodes,
        "resources.gpus_per_node": gpus,
        "provider": provider,
        "resources.spot": spot,
        "budget.max_cost_usd": max_cost,
        "budget.idle_timeout": idle_timeout,
    }
    loaded = load_job(job_file, overrides)
    default_runtime = settings.controller.default_max_runtime
    if default_runtime is not None and loaded.spec.budget.max_runtime is None:
        loaded = load_job(job_file, {**overrides, "budget.max_runtime": default_runtime})
    now = utcnow()
    deadline = loaded.spec.deadline_at(now)
    if deadline is not None and deadline <= now:
        raise SpecError(
            f"deadline {deadline:%Y-%m-%dT%H:%M:%SZ} has already passed",
            hint="give a later time, or a duration after submit such as deadline: 36h",
        )
    chosen = get_provider(loaded.spec.provider, settings)
    planned = _plan(loaded.spec, chosen)
    plan, dry_run_document = planned.plan, planned.document
    if dry_run:
        if json_out:
            _print_json({**dry_run_document, "spec": loaded.spec.public_document()})
        else:
            Console().print(
                f"would launch {plan.nodes} x {plan.instance_type} ({plan.market}) on "
                f"{plan.provider} at ${plan.price_per_node_hour}/node-hour "
                f"(${plan.hourly_usd}/h in all"
                + (
                    f", ${plan.cost_at_max_runtime:.2f} for max_runtime)"
                    if plan.cost_at_max_runtime is not None
                    else ")"
                )
            )
        return
    max_hourly = loaded.spec.budget.max_hourly_usd
    if max_hourly is not None and plan.hourly_usd > max_hourly:
        raise SpecError(
            f"the plan costs ${plan.hourly_usd}/h, above budget.max_hourly_usd ${max_hourly}/h",
            hint="use fewer or cheaper nodes, or raise budget.max_hourly_usd",
        )
    if not yes:
        _confirm_spend(loaded.spec, plan)
    ledger = _ledger(settings)
    job_id = new_job_id(loaded.spec.name)
    if detach:
        register_job(settings, ledger, loaded, chosen.name, job_id)
        wait_for_controller(settings, job_id, spawn_controller(settings, job_id))
        if json_out:
            _print_json(job_document(ledger, settings, ledger.get_job(job_id), detail=False))
        else:
            Console(stderr=True).print(
                f"job {job_id} submitted; follow it with `orch status {job_id}` or "
                f"`orch logs {job_id} -f`, stop it with `orch cancel {job_id}`",
                highlight=False,
            )
            sys.stdout.write(f"{job_id}\n")
        return
    lock = ControllerLock(settings, job_id)
    lock.acquire()  # a new id: nobody else can hold it
    job = register_job(settings, ledger, loaded, chosen.name, job_id)
    console = Console(stderr=json_out)
    console.print(f"job [bold]{job.id}[/] submitted ({loaded.source.name})")
    # SIGINT too: a shell starts background jobs with SIGINT ignored, and `orch cancel`, Ctrl-C
    # and SIGTERM must all reach a foreground controller the same way.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    from orchestrator.cli.console import RichReporter

    options = RunnerOptions(
        **{
            **settings.controller.runner_options(),
            "watch_interval": min(settings.controller.watch_interval, FOREGROUND_WATCH_INTERVAL),
        }
    )
    try:
        with RichReporter(console, job.id) as reporter:
            outcome = JobRunner(
                job, loaded, settings=settings, ledger=ledger, provider=chosen,
                reporter=reporter, options=options,
            ).run()  # fmt: skip
    finally:
        lock.release()
    document = job_document(ledger, settings, ledger.get_job(job.id), detail=json_out)
    if json_out:
        _print_json(document)
    else:
        style = "green" if outcome.state is JobState.SUCCEEDED else "red"
        console.print(
            f"[{style}]{outcome.state.value}[/] job {job.id}: step {document['step']}, "
            f"spend ${document['spend_usd']:.4f}, "
            f"{len(document['checkpoints'])} checkpoint(s) kept: "
            f"{_kept_where(loaded.spec.checkpoint, settings.job_dir(job.id) / 'checkpoints')}"
        )
        if outcome.reason and outcome.state is not JobState.SUCCEEDED:
            console.print(outcome.reason, markup=False, highlight=False)
        console.print(f"bill: orch cost --job {job.id}")
    raise typer.Exit(outcome.exit_code)


@app.command()
def status(
    job_id: Annotated[str | None, typer.Argument(help="a job id; all jobs when omitted")] = None,
    json_out: JsonFlag = False,
    watch: Annotated[bool, typer.Option("--watch", help="live view until the job ends")] = False,
    interval: Annotated[
        float | None, typer.Option("--interval", help="seconds between --watch refreshes [2]")
    ] = None,
) -> None:
    """Show jobs, or one job with its leases, checkpoints and events (--watch: live)."""
    from orchestrator.cli.console import job_detail, jobs_table
    from orchestrator.report.documents import job_document

    settings = load_settings()
    ledger = _ledger(settings)
    console = Console()
    if watch or interval is not None:
        from orchestrator.cli.live import watch_command

        watch_command(
            settings, ledger, console, job_id, watch=watch, json_out=json_out, interval=interval
        )
        return
    if job_id:
        document = job_document(ledger, settings, ledger.get_job(job_id))
        if json_out:
            _print_json(document)
        else:
            for renderable in job_detail(document):
                console.print(renderable)
        return
    documents = [job_document(ledger, settings, j, detail=False) for j in ledger.jobs(limit=50)]
    if json_out:
        _print_json({"jobs": documents})
    else:
        console.print(jobs_table(documents))


@app.command()
def logs(
    job_id: Annotated[str, typer.Argument(help="job id")],
    rank: Annotated[int | None, typer.Option("--rank", help="only this global rank")] = None,
    node: Annotated[int | None, typer.Option("--node", help="this node's whole log")] = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="keep printing")] = False,
) -> None:
    """Print a job's logs (rank 0 by default) as pulled from its nodes.

    The rotated files of a capped log (node-0.log.3 ... .1, settings `logs.*`) are read
    first, oldest first; -f follows the log across rotations."""
    from orchestrator.cluster.log_files import read_from
    from orchestrator.node.progress import rank_lines

    settings = load_settings()
    ledger = _ledger(settings)
    job = ledger.get_job(job_id)
    if rank is not None and node is not None:
        raise SpecError("give --rank or --node, not both")
    if rank is not None and not 0 <= rank < job.nodes * job.gpus_per_node:
        raise SpecError(f"--rank must be between 0 and {job.nodes * job.gpus_per_node - 1}")
    node_index = node if node is not None else (rank or 0) // job.gpus_per_node
    local_rank = None if node is not None else (rank or 0) % job.gpus_per_node
    path = settings.job_dir(job.id) / "logs" / f"node-{node_index}.log"
    consumed = 0  # position in the log's stream, across its rotated files
    while True:
        done = not follow or JobState(ledger.get_job(job.id).state).is_final
        first, data = read_from(path, consumed)
        if not done:  # a line still being written is printed once it is whole
            data = data[: data.rfind(b"\n") + 1]
        for line in rank_lines(data.decode(errors="replace"), local_rank):
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
        consumed = first + len(data)
        if done:
            break
        time.sleep(1.0)
    if not consumed:
        Console(stderr=True).print(
            f"no log of node {node_index} yet (logs arrive with the controller's next watch tick)"
        )


def _is_orch_process(pid: int) -> bool:
    """Whether `pid` is a live orch process (a controller: daemon or foreground submit)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.startswith(b"orchestrator") or arg.endswith(b"/orch") for arg in args)


@app.command()
def cancel(job_id: Annotated[str, typer.Argument(help="job id")]) -> None:
    """Cancel a job: its trainers checkpoint, the checkpoint is pulled, nodes shut down."""
    from orchestrator.control.reconcile import end_nodes
    from orchestrator.control.supervision import ControllerLock, controller_pid

    settings = load_settings()
    ledger = _ledger(settings)
    job = ledger.get_job(job_id)
    console = Console()
    if JobState(job.state).is_final:
        console.print(f"job {job_id} already ended: {job.state}")
        return
    # Ending the nodes here is the controller's work: done only while holding its lock, so a
    # controller that is being revived right now cannot drive the job at the same time.
    lock = ControllerLock(settings, job_id)
    if not lock.acquire():
        # A controller that just took the lock writes its pid a moment later: until then the
        # file may still name a dead one.
        deadline = time.monotonic() + 10
        pid = controller_pid(settings, job_id)
        while not (pid and _is_orch_process(pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
            pid = controller_pid(settings, job_id)
        if not (pid and _is_orch_process(pid)):
            raise OrchError(
                f"the controller of {job_id} holds its lock but names no live process",
                hint=f"run `orch cancel {job_id}` again in a moment",
            )
        os.kill(pid, signal.SIGTERM)
        console.print(f"cancelling {job_id}: its controller stops the trainers and the nodes")
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            state = JobState(ledger.get_job(job_id).state)
            if state.is_final:
                console.print(f"job {job_id}: {state.value}")
                return
            time.sleep(0.5)
        raise OrchError(
            f"job {job_id} did not stop within 600 s", hint="`orch down` ends its nodes at once"
        )
    try:
        job = ledger.get_job(job_id)
        if JobState(job.state).is_final:  # its last controller finished meanwhile
            console.print(f"job {job_id} already ended: {job.state}")
            return
        provider = get_provider(job.provider, settings)
        _check_job_identity(ledger, job_id, provider)
        ids = [i.instance_id for i in _ours(ledger, provider.list_owned(job_id=job_id))]
        if ids:
            end_nodes(ledger, provider, job_id, ids, home=settings.home)
        ledger.update_job(
            job_id, state=JobState.CANCELLED, exit_code=130, reason="cancelled", ended_at=utcnow()
        )
        ledger.add_event(job_id, "CANCELLED", "cancelled with no live controller")
    finally:
        lock.release()
    console.print(f"job {job_id}: CANCELLED ({len(ids)} node(s) terminated)")


@app.command()
def cost(
    job_id: Annotated[str | None, typer.Option("--job", help="only this job")] = None,
    json_out: JsonFlag = False,
) -> None:
    """What jobs cost: node-seconds x the price recorded at launch."""
    from orchestrator.cli.console import cost_table
    from orchestrator.report.documents import cost_document

    document = cost_document(_ledger(load_settings()), job_id)
    if json_out:
        _print_json(document)
    else:
        Console().print(cost_table(document))


@app.command()
def report(
    job_id: Annotated[str, typer.Argument(help="job id")],
    out: Annotated[
        Path | None, typer.Option("--out", help="file to write [ORCH_HOME/jobs/<id>/report.png]")
    ] = None,
    html: Annotated[
        bool, typer.Option("--html", help="an HTML page with the picture and the job's tables")
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Draw a job: GPU use per node, spend and budget, events; prints the file written."""
    from orchestrator.report.write import write_report

    settings = load_settings()
    result = write_report(settings, _ledger(settings), job_id, out=out, html=html)
    if json_out:
        _print_json(result.as_dict())
    else:
        sys.stdout.write(f"{result.path}\n")


@app.command()
def down(
    cluster: Annotated[str | None, typer.Argument(help="cluster (job id) to shut down")] = None,
    all_clusters: Annotated[
        bool, typer.Option("--all", help="every cluster of this ledger")
    ] = False,
) -> None:
    """Terminate a cluster's nodes now (or all of this ledger's), whatever their job is doing;
    nodes of other ledgers are listed, never ended."""
    from orchestrator.control.ownership import not_ours_line
    from orchestrator.control.reconcile import end_nodes
    from orchestrator.control.supervision import controller_running

    if (cluster is None) == (not all_clusters):
        raise SpecError("give a cluster name or --all (not both)")
    settings = load_settings()
    ledger = _ledger(settings)
    ended = 0
    others: list[str] = []
    for provider in _providers_in_use(settings, ledger):
        wanted = [i for i in provider.list_owned() if all_clusters or i.cluster == cluster]
        found = _partition(ledger, wanted)
        others += [i.instance_id for i in found.others]
        by_job: dict[str, list[str]] = {}
        for instance in found.ours:
            by_job.setdefault(instance.job_id, []).append(instance.instance_id)
        for job_id, ids in by_job.items():
            end_nodes(ledger, provider, job_id, ids, home=settings.home)
            ended += len(ids)
            with contextlib.suppress(UnknownJob):
                job = ledger.get_job(job_id)
                if not JobState(job.state).is_final and not controller_running(settings, job_id):
                    ledger.update_job(
                        job_id, state=JobState.CANCELLED, exit_code=130, reason="orch down",
                        ended_at=utcnow(),
                    )  # fmt: skip
            Console().print(f"{job_id}: terminated {len(ids)} {provider.name} node(s)")
    if line := not_ours_line(others):
        Console().print(line)
    if cluster is not None and not ended:
        raise SpecError(
            f"no running cluster {cluster!r} of this ledger",
            hint="`orch status` lists jobs; a cluster of another ledger is ended from there",
        )
    if not ended:
        Console().print("nothing to shut down")


def _partition(ledger: Ledger, instances: list[Instance]) -> Partition:
    """`instances` split into this ledger's and the others (`orchestrator.control.ownership`)."""
    from orchestrator.control.ownership import partition

    leased = {lease.instance_id for lease in ledger.leases()}
    return partition(instances, ledger.ledger_id, leased=leased)


def _ours(ledger: Ledger, instances: list[Instance]) -> list[Instance]:
    return _partition(ledger, instances).ours


def _check_job_identity(ledger: Ledger, job_id: str, provider: Provider) -> None:
    """Raise `IdentityMismatch` when the provider acts as another identity than the job's."""
    from orchestrator.control.ownership import check_identity

    recorded = [ledger.get_job(job_id).identity]
    recorded += [lease.identity for lease in ledger.leases(job_id, open_only=True)]
    if any(text is not None for text in recorded):
        check_identity(job_id, recorded, provider.identity())


@app.command()
def catalog(
    gpu: Annotated[str | None, typer.Option("--gpu", help="only this GPU, e.g. A10G")] = None,
    json_out: JsonFlag = False,
) -> None:
    """AWS GPU instance types with their GPUs and on-demand prices per region."""
    from rich.table import Table

    from orchestrator.providers.aws.catalog import catalog_document, catalog_rows, load_catalog

    data = load_catalog()
    if json_out:
        _print_json(catalog_document(data, gpu=gpu))
        return
    rows = catalog_rows(data, gpu=gpu)
    if not rows:
        raise SpecError(
            f"no instance type with GPU {gpu!r}",
            hint=f"GPUs in the catalog: {', '.join(data.accelerators())}",
        )
    regions = sorted({region for row in rows for region in row["on_demand_usd_per_hour"]})
    table = Table(title=f"AWS GPU instance types, on-demand $/h (catalog {data.date})")
    for column in ("type", "GPU", "GPUs", "GiB/GPU", "vCPU", "RAM GiB", *regions):
        table.add_column(column, justify="left" if column in ("type", "GPU") else "right")
    for row in rows:
        table.add_row(
            row["instance_type"], row["gpu"], str(row["gpus"]), f"{row['gpu_memory_gib']:g}",
            str(row["vcpus"]), f"{row['memory_gib']:g}",
            *(row["on_demand_usd_per_hour"].get(region, "-") for region in regions),
        )  # fmt: skip
    Console().print(table)


app.command(name="simulate")(simulate_command)


def _providers_in_use(settings: Settings, ledger: Ledger) -> list[Provider]:
    """The local provider, plus AWS when a job used it or an endpoint is configured."""
    names = {"local"} | {job.provider for job in ledger.jobs()}
    if settings.aws.endpoint_url:
        names.add("aws")
    return [get_provider(name, settings) for name in sorted(names)]


@app.command()
def reconcile(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="only list what would be revived or ended")
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Give unfinished jobs whose controller died a new one; end this ledger's nodes that no
    live job owns (other ledgers' nodes are listed, never ended)."""
    from orchestrator.control.ownership import not_ours_line
    from orchestrator.control.reconcile import reconcile as run_reconcile

    settings = load_settings()
    ledger = _ledger(settings)
    report = run_reconcile(settings, ledger, _providers_in_use(settings, ledger), dry_run=dry_run)
    if json_out:
        _print_json(
            {
                "terminated": report.terminated,
                "revived": report.revived,
                "not_ours": report.not_ours,
                "recorded": report.recorded,
                "dry_run": dry_run,
            }
        )
        return
    console = Console()
    ended, adopted = ("would terminate", "would get") if dry_run else ("terminated", "got")
    for job_id, ids in report.terminated.items():
        console.print(f"{job_id}: {ended} {len(ids)} node(s) no live job owns: {', '.join(ids)}")
    for job_id in report.revived:
        console.print(f"{job_id}: its controller was gone; it {adopted} a new one")
    if line := not_ours_line(report.not_ours):
        console.print(line)
    for job_id in report.recorded:
        console.print(f"{job_id}: wrote the end its stop could not write into the ledger")
    if not report.terminated and not report.revived and not report.recorded:
        console.print("nothing to reconcile: every node belongs to a job with a live controller")


def _add_sub_apps() -> None:
    from orchestrator.cli.local import app as local_app
    from orchestrator.cli.sandbox import sandbox_app

    app.add_typer(local_app, name="local")
    app.add_typer(sandbox_app, name="sandbox")


_add_sub_apps()


@app.callback()
def _revive_lost_controllers(context: typer.Context) -> None:
    """Before any command: an unfinished job whose controller died gets a new one."""
    if context.invoked_subcommand in ("reconcile", "down", "sandbox"):
        return  # reconcile revives and reports it; down ends nodes, whatever drives them
    from orchestrator.control.supervision import revive_controllers

    settings = load_settings()
    if settings.db_path.exists():
        for job_id in revive_controllers(settings, _ledger(settings)):
            Console(stderr=True).print(
                f"orch: the controller of {job_id} was gone; a new one adopted the job"
            )


def main() -> None:
    """Console-script entry: run the app and turn OrchErrors into messages and exit codes."""
    try:
        app()
    except OrchError as exc:
        Console(stderr=True).print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
