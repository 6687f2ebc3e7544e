"""Placement of a job's nodes on a fleet's hosts (`providers.ssh.placement`, pure): all or
nothing, one node per host, never a held slot nor an unhealthy or avoided host, best fit, the
lowest free slots; why a job can never fit; who of a queue starts first."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.providers.ssh.placement import (
    HostSlots,
    Placement,
    first_in_line,
    fits_ever,
    place,
)

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


def gpu_host(host_id: int, free: tuple[int, ...], gpus: int = 8, *, name: str = A100,
             healthy: bool = True) -> HostSlots:  # fmt: skip
    return HostSlots(host_id, tuple(range(gpus)), free, healthy, (name,) * gpus)


def cpu_host(host_id: int, cpus: int) -> HostSlots:
    return HostSlots(host_id, tuple(range(cpus)), tuple(range(cpus)), True, ())


# --- examples -------------------------------------------------------------------------------


def test_two_4_gpu_jobs_share_an_8_gpu_host() -> None:
    host = gpu_host(1, tuple(range(8)))
    first = place([host], ranks=[0], slots_per_node=4)
    assert first == [Placement(0, 1, (0, 1, 2, 3))]
    after = gpu_host(1, (4, 5, 6, 7))
    assert place([after], ranks=[0], slots_per_node=4) == [Placement(0, 1, (4, 5, 6, 7))]
    assert place([gpu_host(1, ())], ranks=[0], slots_per_node=1) is None


def test_best_fit_keeps_the_large_hole_for_a_large_job() -> None:
    roomy, tight = gpu_host(1, tuple(range(8))), gpu_host(2, (6, 7))
    assert place([roomy, tight], ranks=[0], slots_per_node=2) == [Placement(0, 2, (6, 7))]
    # equal holes: the host listed first
    twins = [gpu_host(5, (0, 1)), gpu_host(3, (2, 3))]
    assert place(twins, ranks=[0], slots_per_node=2) == [Placement(0, 5, (0, 1))]


def test_a_multi_node_job_is_placed_whole_or_not_at_all_one_node_per_host() -> None:
    hosts = [gpu_host(1, tuple(range(8))), gpu_host(2, (0, 1, 2))]
    assert place(hosts, ranks=[0, 1], slots_per_node=4) is None  # host 2 has 3 free
    assert place([hosts[0]], ranks=[0, 1], slots_per_node=4) is None  # 8 free, but one host
    both = place(hosts, ranks=[0, 1], slots_per_node=3)
    assert both == [Placement(0, 1, (0, 1, 2)), Placement(1, 2, (0, 1, 2))]


def test_unhealthy_and_avoided_hosts_are_never_used() -> None:
    sick = gpu_host(1, tuple(range(8)), healthy=False)
    lost, spare = gpu_host(2, tuple(range(8))), gpu_host(3, (0, 1))
    assert place([sick], ranks=[0], slots_per_node=1) is None
    replacing = place([sick, lost, spare], ranks=[1], slots_per_node=2, avoid=frozenset({2}))
    assert replacing == [Placement(1, 3, (0, 1))]
    assert place([sick, lost], ranks=[1], slots_per_node=2, avoid=frozenset({2})) is None


def test_an_accelerator_matches_the_gpu_name_case_insensitively() -> None:
    mixed = HostSlots(1, (0, 1, 2, 3), (0, 1, 2, 3), True, (H100, A100, H100, A100))
    assert place([mixed], ranks=[0], slots_per_node=2, accelerator="a100") == [
        Placement(0, 1, (1, 3))
    ]
    assert place([mixed], ranks=[0], slots_per_node=3, accelerator="A100") is None
    assert place([cpu_host(2, 16)], ranks=[0], slots_per_node=1, accelerator="A100") is None


def test_a_cpu_host_offers_process_slots() -> None:
    assert place([cpu_host(4, 4)], ranks=[0], slots_per_node=2) == [Placement(0, 4, (0, 1))]


def test_why_a_job_never_fits_names_the_fleets_size() -> None:
    lab = [gpu_host(1, ()), gpu_host(2, (), gpus=4)]  # all held now: fits_ever ignores that
    assert fits_ever(lab, 2, 4, None, fleet="gpu-lab") is None
    assert fits_ever(lab, 3, 4, None, fleet="gpu-lab") == (
        "fleet gpu-lab has 2 host(s): 8 + 4 GPUs; the job asks 3 node(s) x 4, one node per host"
    )
    assert fits_ever(lab, 1, 16, None) == (
        "the fleet has 2 host(s): 8 + 4 GPUs; the job asks 1 node(s) x 16, one node per host"
    )
    why = fits_ever(lab, 1, 1, "H100", fleet="gpu-lab")
    assert why is not None and "no GPU matching 'H100'" in why and A100 in why
    cpus = [cpu_host(1, 16), cpu_host(2, 16)]
    assert fits_ever(cpus, 3, 2, None) == (
        "the fleet has 2 host(s): 16 + 16 CPUs; the job asks 3 node(s) x 2, one node per host"
    )
    why = fits_ever(cpus, 1, 1, "A100")
    assert why is not None and "(it has no GPUs)" in why
    assert "8 GPUs + 16 CPUs" in (fits_ever([lab[0], cpus[0]], 3, 1, None) or "")


def test_the_first_waiter_that_fits_starts_a_later_one_may_pass() -> None:
    hosts = [gpu_host(1, (4, 5, 6, 7)), gpu_host(2, (0, 1))]
    queue = [("big", 2, 4), ("small", 1, 2), ("mid", 1, 4)]
    assert first_in_line(queue, hosts) == "small"
    assert first_in_line([("big", 2, 4)], hosts) is None
    assert first_in_line([], hosts) is None
    needs_h100 = [("h", 1, 1), ("any", 1, 1)]
    assert first_in_line(needs_h100, hosts, accelerators={"h": "H100"}) == "any"


# --- properties -----------------------------------------------------------------------------


@st.composite
def fleets(draw: st.DrawFn) -> list[HostSlots]:
    """A fleet of 0..6 hosts: GPU hosts (1..8 GPUs, A100 or H100) and CPU hosts, some slots
    held, some hosts unhealthy; host ids unique but in no particular order."""
    count = draw(st.integers(0, 6))
    ids = draw(st.lists(st.integers(1, 99), min_size=count, max_size=count, unique=True))
    hosts = []
    for host_id in ids:
        size = draw(st.integers(1, 8))
        slots = tuple(range(size))
        free = tuple(s for s in slots if draw(st.booleans()) or draw(st.booleans()))
        names = draw(st.one_of(st.just(()), st.lists(st.sampled_from([A100, H100]),
                                                      min_size=size, max_size=size)))  # fmt: skip
        hosts.append(HostSlots(host_id, slots, free, draw(st.integers(0, 4)) > 0, tuple(names)))
    return hosts


def eligible(host: HostSlots, avoid: frozenset[int], accelerator: str | None) -> list[int]:
    """The free slots of `host` a node may take, stated independently of the module."""
    if not host.healthy or host.host_id in avoid:
        return []
    names = dict(zip(host.slots, host.gpu_names, strict=False))
    return sorted(
        s for s in host.free
        if accelerator is None or (s in names and accelerator.lower() in names[s].lower())
    )  # fmt: skip


@given(
    hosts=fleets(),
    nodes=st.integers(0, 4),
    slots_per_node=st.integers(1, 8),
    avoid=st.frozensets(st.integers(1, 99), max_size=3),
    accelerator=st.sampled_from([None, "a100", "H100"]),
)
def test_a_placement_keeps_every_rule(
    hosts: list[HostSlots],
    nodes: int,
    slots_per_node: int,
    avoid: frozenset[int],
    accelerator: str | None,
) -> None:
    ranks = list(range(nodes))
    placed = place(
        hosts, ranks=ranks, slots_per_node=slots_per_node, avoid=avoid, accelerator=accelerator
    )
    room = {h.host_id: eligible(h, avoid, accelerator) for h in hosts}
    fitting = [h for h in hosts if len(room[h.host_id]) >= slots_per_node]
    if placed is None:  # all or nothing, and nothing only when it cannot fit
        assert len(fitting) < nodes
        return
    assert sorted(p.rank for p in placed) == ranks
    used = [p.host_id for p in placed]
    assert len(set(used)) == len(used), "two nodes of one job on one host"
    for p in placed:
        free = room[p.host_id]  # never held, unhealthy, avoided or another accelerator
        assert len(p.slots) == slots_per_node and set(p.slots) <= set(free)
        assert list(p.slots) == free[:slots_per_node], "the lowest free slots"
    # best fit: no host left out had fewer usable free slots than one taken
    taken = max((len(room[i]) for i in used), default=0)
    assert all(len(room[h.host_id]) >= taken for h in fitting if h.host_id not in used)
    # and fits_ever agrees that a placed job can run on the fleet
    assert fits_ever(hosts, nodes, slots_per_node, accelerator) is None


@given(hosts=fleets(), nodes=st.integers(1, 4), slots_per_node=st.integers(1, 8))
def test_a_job_that_never_fits_never_places_and_one_that_does_on_an_empty_fleet(
    hosts: list[HostSlots], nodes: int, slots_per_node: int
) -> None:
    why = fits_ever(hosts, nodes, slots_per_node, None)
    empty = [HostSlots(h.host_id, h.slots, h.slots, True, h.gpu_names) for h in hosts]
    whole = place(empty, ranks=range(nodes), slots_per_node=slots_per_node)
    assert (why is None) == (whole is not None)
    if why is not None:
        assert place(hosts, ranks=range(nodes), slots_per_node=slots_per_node) is None
        assert f"has {len(hosts)} host(s)" in why
