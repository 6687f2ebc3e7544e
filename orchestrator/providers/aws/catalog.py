"""The AWS GPU instance catalog: a versioned, dated data file of types and on-demand prices.

The file (`orchestrator/data/aws_catalog.json`, package data) is read with
`importlib.resources`, validated here, and never re-read to price a past run: the price of a node
is recorded in the ledger when it is launched. Prices are Decimal USD per node-hour.

Pure apart from `load_catalog`, which reads the file it is given (or the packaged one).
"""

from __future__ import annotations

import json
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.errors import ConfigError

CATALOG_VERSION = 1  # the file format this module reads


class InstanceType(BaseModel):
    """One instance type: its GPUs, size, and on-demand price in each region it is sold in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)  # e.g. "g5.xlarge"
    family: str = Field(min_length=1)  # e.g. "g5"
    gpu: str = Field(min_length=1)  # GPU model, e.g. "A10G"
    gpus: int = Field(ge=1)  # GPUs per instance
    gpu_memory_gib: float = Field(gt=0)  # memory of ONE GPU
    vcpus: int = Field(ge=1)
    memory_gib: float = Field(gt=0)  # host RAM
    on_demand: dict[str, Decimal]  # region -> USD per hour; a region not listed does not sell it

    @model_validator(mode="after")
    def _prices_positive(self) -> InstanceType:
        for region, price in self.on_demand.items():
            if not price.is_finite() or price <= 0:
                raise ValueError(f"on-demand price in {region} must be > 0, got {price}")
        return self

    def price_in(self, region: str) -> Decimal | None:
        """On-demand USD per hour in `region`; None when the type is not sold there."""
        return self.on_demand.get(region)


class Catalog(BaseModel):
    """The whole catalog file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int
    date: str  # day the prices were taken (ISO date)
    source: str  # where the prices come from
    types: tuple[InstanceType, ...]

    @model_validator(mode="after")
    def _check(self) -> Catalog:
        if self.version != CATALOG_VERSION:
            raise ValueError(f"catalog version {self.version} is not {CATALOG_VERSION}")
        names = [t.name for t in self.types]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate instance types: {', '.join(dupes)}")
        return self

    def get(self, name: str) -> InstanceType | None:
        """The type called `name`, or None."""
        return next((t for t in self.types if t.name == name), None)

    def accelerators(self) -> list[str]:
        """GPU model names in the catalog, sorted."""
        return sorted({t.gpu for t in self.types})

    def query(
        self,
        *,
        accelerator: str | None = None,
        gpus: int | None = None,
        min_gpu_memory_gb: float | None = None,
        region: str | None = None,
    ) -> list[InstanceType]:
        """Types with `accelerator` (case-insensitive; None: any), at least `gpus` GPUs, at least
        `min_gpu_memory_gb` GiB per GPU, and (when `region` is given) sold in `region`.

        Ordered by name. GPU memory is compared in GiB as AWS lists it (a "24 GB" A10G is 24).
        """
        wanted = accelerator.strip().lower() if accelerator else None
        return sorted(
            (
                t
                for t in self.types
                if (wanted is None or t.gpu.lower() == wanted)
                and (gpus is None or t.gpus >= gpus)
                and (min_gpu_memory_gb is None or t.gpu_memory_gib >= min_gpu_memory_gb)
                and (region is None or region in t.on_demand)
            ),
            key=lambda t: t.name,
        )


def parse_catalog(data: Any, *, origin: str = "catalog") -> Catalog:
    """Validate a decoded catalog document; `ConfigError` names the field that is wrong."""
    try:
        return Catalog.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid instance catalog {origin}: {problems}") from exc


def load_catalog(path: Path | None = None) -> Catalog:
    """Read and validate the catalog at `path`, or the one packaged with orch."""
    if path is None:
        source = resources.files("orchestrator").joinpath("data", "aws_catalog.json")
        origin = "orchestrator/data/aws_catalog.json"
    else:
        source, origin = path, str(path)
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read instance catalog {origin}: {exc}") from exc
    return parse_catalog(data, origin=origin)


def catalog_rows(catalog: Catalog, *, gpu: str | None = None) -> list[dict[str, Any]]:
    """What `orch catalog [--gpu NAME] [--json]` shows: one row per type (and GPU filter).

    Prices are strings (exact decimals) keyed by region; rows are ordered by family, GPU count,
    then name.
    """
    types = catalog.query(accelerator=gpu)
    types.sort(key=lambda t: (t.family, t.gpus, min(t.on_demand.values(), default=0), t.name))
    return [
        {
            "instance_type": t.name,
            "family": t.family,
            "gpu": t.gpu,
            "gpus": t.gpus,
            "gpu_memory_gib": t.gpu_memory_gib,
            "vcpus": t.vcpus,
            "memory_gib": t.memory_gib,
            "on_demand_usd_per_hour": {r: str(p) for r, p in sorted(t.on_demand.items())},
        }
        for t in types
    ]


def catalog_document(catalog: Catalog, *, gpu: str | None = None) -> dict[str, Any]:
    """The `orch catalog --json` document: version, date, source and the rows."""
    return {
        "version": catalog.version,
        "date": catalog.date,
        "source": catalog.source,
        "types": catalog_rows(catalog, gpu=gpu),
    }
