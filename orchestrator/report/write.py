"""`orch report JOB`: draw a job's report from the ledger and write it where asked."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from orchestrator.atomic import write_atomic
from orchestrator.config import Settings
from orchestrator.errors import SpecError
from orchestrator.ledger.store import Ledger, utcnow
from orchestrator.report.data import ReportData, build_report


@dataclass(frozen=True)
class ReportResult:
    path: Path  # the file written
    format: str  # "png" or "html"
    series: int  # utilization lines drawn (one per node and GPU)
    samples: int  # readings behind them
    markers: int  # events marked on the time axis
    progress: int  # progress samples of rank 0 behind the loss and throughput curves

    def as_dict(self) -> dict:
        return {
            "path": str(self.path),
            "format": self.format,
            "series": self.series,
            "samples": self.samples,
            "markers": self.markers,
            "progress": self.progress,
        }


def default_report_path(settings: Settings, job_id: str, *, html: bool) -> Path:
    """ORCH_HOME/jobs/<id>/report.png (report.html with `html`)."""
    return settings.job_dir(job_id) / ("report.html" if html else "report.png")


def report_data(ledger: Ledger, job_id: str, now: datetime | None = None) -> ReportData:
    """The ledger rows of a job turned into what its report draws (UnknownJob if none)."""
    job = ledger.get_job(job_id)
    return build_report(
        job,
        ledger.leases(job_id),
        ledger.events(job_id),
        ledger.gpu_samples(job_id),
        now or utcnow(),
        ledger.progress_samples(job_id),
    )


def write_report(
    settings: Settings, ledger: Ledger, job_id: str, *, out: Path | None, html: bool
) -> ReportResult:
    """Draw the job's report (PNG, or an HTML page embedding it) and write it atomically to
    `out` or the default path. Raises UnknownJob for an unknown id, SpecError for an `out`
    that cannot be written."""
    from orchestrator.report.documents import job_document
    from orchestrator.report.render import render_html, render_png

    data = report_data(ledger, job_id)
    path = (out or default_report_path(settings, job_id, html=html)).expanduser().absolute()
    if path.is_dir():
        raise SpecError(f"--out {path} is a directory", hint="give a file name, e.g. report.png")
    png = render_png(data)
    if html:
        document = job_document(ledger, settings, ledger.get_job(job_id))
        content = render_html(document, png).encode("utf-8")
    else:
        content = png
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, content)
    except OSError as exc:
        raise SpecError(f"cannot write {path}: {exc.strerror or exc}", hint="choose --out") from exc
    return ReportResult(
        path=path,
        format="html" if html else "png",
        series=len(data.utilization),
        samples=data.sample_count,
        markers=len(data.markers),
        progress=len(data.progress),
    )
