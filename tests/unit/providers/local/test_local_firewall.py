"""The local provider's firewall rules as text: what iptables and nft print (as captured from
Debian's iptables 1.8.9 and nftables 1.0.6 after Docker's daemon started), orch's rules, and
what `orch check` says about a host."""

from __future__ import annotations

import json

import pytest

from orchestrator.providers.local import firewall as fw

# `iptables -t filter -S` once Docker's daemon (20.10) started, orch's rule in DOCKER-USER.
DOCKER = """\
-P INPUT ACCEPT
-P FORWARD DROP
-P OUTPUT ACCEPT
-N DOCKER
-N DOCKER-ISOLATION-STAGE-1
-N DOCKER-ISOLATION-STAGE-2
-N DOCKER-USER
-A FORWARD -j DOCKER-USER
-A FORWARD -j DOCKER-ISOLATION-STAGE-1
-A FORWARD -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A FORWARD -o docker0 -j DOCKER
-A FORWARD -i docker0 ! -o docker0 -j ACCEPT
-A FORWARD -i docker0 -o docker0 -j ACCEPT
-A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2
-A DOCKER-ISOLATION-STAGE-1 -j RETURN
-A DOCKER-ISOLATION-STAGE-2 -o docker0 -j DROP
-A DOCKER-ISOLATION-STAGE-2 -j RETURN
-A DOCKER-USER -i orchbr0 -o orchbr0 -m comment --comment "orch-bridge:orchbr0" -j ACCEPT
-A DOCKER-USER -j RETURN
"""

PRISTINE = "-P INPUT ACCEPT\n-P FORWARD ACCEPT\n-P OUTPUT ACCEPT\n"


def test_docker_s_table_is_read_rule_by_rule() -> None:
    table = fw.parse_iptables_s(DOCKER)
    assert table.policies == {"INPUT": "ACCEPT", "FORWARD": "DROP", "OUTPUT": "ACCEPT"}
    assert "DOCKER-USER" in table.chains and len(table.chains) == 4
    assert fw.ipt_drops(table) == "policy DROP" and not fw.ipt_open(table)
    assert fw.ipt_allow_chain(table) == "DOCKER-USER"
    ((rule, bridge),) = fw.ipt_tagged(table)
    assert bridge == "orchbr0" and rule.chain == "DOCKER-USER"
    assert rule.comment == "orch-bridge:orchbr0"
    assert fw.ipt_allows(table, "orchbr0") and not fw.ipt_allows(table, "other0")
    # deleted by its exact specification, the comment unquoted (argv, no shell)
    assert fw.ipt_delete_argv("/usr/sbin/iptables-nft", rule) == [
        "/usr/sbin/iptables-nft", "-w", "5", "-t", "filter", "-D", "DOCKER-USER",
        "-i", "orchbr0", "-o", "orchbr0", "-m", "comment", "--comment", "orch-bridge:orchbr0",
        "-j", "ACCEPT",
    ]  # fmt: skip


def test_the_rule_goes_first_in_forward_without_docker_user() -> None:
    table = fw.parse_iptables_s("-P INPUT ACCEPT\n-P FORWARD DROP\n-P OUTPUT ACCEPT\n")
    assert fw.ipt_insert_argv("iptables-legacy", table, "orchbr0") == [
        "iptables-legacy", "-w", "5", "-t", "filter", "-I", "FORWARD", "1",
        "-i", "orchbr0", "-o", "orchbr0", "-m", "comment", "--comment", "orch-bridge:orchbr0",
        "-j", "ACCEPT",
    ]  # fmt: skip


def test_a_host_without_a_firewall_gets_no_rule() -> None:
    table = fw.parse_iptables_s(PRISTINE)
    assert fw.ipt_open(table) and fw.ipt_drops(table) == ""
    # orch's own leftover does not make the chain a firewall
    orphan = '-A FORWARD -i gone0 -o gone0 -m comment --comment "orch-bridge:gone0" -j ACCEPT'
    leftover = PRISTINE + orphan + "\n"
    assert fw.ipt_open(fw.parse_iptables_s(leftover))


def test_a_final_drop_or_reject_rule_drops_too() -> None:
    table = fw.parse_iptables_s(
        "-P FORWARD ACCEPT\n-A FORWARD -i eth0 -j ACCEPT\n"
        "-A FORWARD -j REJECT --reject-with icmp-port-unreachable\n"
    )
    assert fw.ipt_drops(table) == (
        "a rule `-A FORWARD -j REJECT --reject-with icmp-port-unreachable`"
    )


def test_other_comments_and_unreadable_lines_are_not_orch_s() -> None:
    table = fw.parse_iptables_s(
        '-A FORWARD -m comment --comment "orch-bridge:bad name" -j ACCEPT\n'
        '-A FORWARD -m comment --comment "ufw rule" -j ACCEPT\n'
        '-A FORWARD -m comment --comment "unclosed\n'
        "-X what\n"
    )
    assert fw.ipt_tagged(table) == [] and len(table.rules) == 2


def test_tags_name_interfaces_only() -> None:
    assert fw.tag("orchbr0") == "orch-bridge:orchbr0"
    assert fw.bridge_of("orch-bridge:orchbr0") == "orchbr0"
    assert fw.bridge_of("orch-bridge:") is None and fw.bridge_of(None) is None
    assert fw.bridge_of("orch-bridge:" + "x" * 16) is None
    with pytest.raises(ValueError):
        fw.tag('br"; flush ruleset')


def nft_doc(*items: dict) -> str:
    return json.dumps({"nftables": [{"metainfo": {"version": "1.0.6"}}, *items]})


def chain(family: str, table: str, name: str, policy: str = "accept", hook: str = "forward"):
    return {"chain": {"family": family, "table": table, "name": name, "handle": 1,
                      "type": "filter", "hook": hook, "prio": 0, "policy": policy}}  # fmt: skip


def rule(family: str, table: str, name: str, handle: int, expr: list, comment: str = "") -> dict:
    doc = {"family": family, "table": table, "chain": name, "handle": handle, "expr": expr}
    return {"rule": doc | ({"comment": comment} if comment else {})}


ORCH_EXPR = [
    {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "orchbr0"}},
    {"match": {"op": "==", "left": {"meta": {"key": "oifname"}}, "right": "orchbr0"}},
    {"accept": None},
]


def test_nft_forward_chains_are_found_with_their_rules() -> None:
    text = nft_doc(
        {"table": {"family": "inet", "name": "fw", "handle": 3}},
        chain("inet", "fw", "forward", "drop"),
        chain("inet", "fw", "input", "drop", hook="input"),
        chain("bridge", "br", "forward", "drop"),
        chain("ip", "filter", "FORWARD", "drop"),
        {"chain": {"family": "inet", "table": "fw", "name": "helper", "handle": 9}},
        rule("inet", "fw", "forward", 7, ORCH_EXPR, "orch-bridge:orchbr0"),
        rule("inet", "fw", "forward", 8, [{"counter": {"packets": 0, "bytes": 0}}, {"drop": None}]),
        rule("inet", "fw", "input", 4, [{"drop": None}]),
    )
    chains = fw.parse_nft_json(text)
    assert {(c.family, c.table, c.name) for c in chains} == {
        ("inet", "fw", "forward"), ("ip", "filter", "FORWARD"),
    }  # fmt: skip
    forward = next(c for c in chains if c.table == "fw")
    assert [r.handle for r in forward.rules] == [7, 8] and forward.rules[1].verdict == "drop"
    assert fw.nft_allows(forward, "orchbr0") and fw.nft_drops(forward) == "policy drop"
    assert fw.nft_delete_argv(forward, forward.rules[0]) == [
        "nft", "delete", "rule", "inet", "fw", "forward", "handle", "7",
    ]  # fmt: skip
    # iptables-nft's own table is left to it when it reads it
    assert [c.table for c in fw.nft_native(chains, iptables_nft=True)] == ["fw"]
    assert len(fw.nft_native(chains, iptables_nft=False)) == 2


def test_nft_rule_text_quotes_names_and_tag() -> None:
    (forward,) = fw.parse_nft_json(nft_doc(chain("inet", "filter", "forward", "drop")))
    assert fw.nft_insert_argv(forward, "orch-br.1") == [
        "nft", "insert", "rule", "inet", "filter", "forward", "iifname", '"orch-br.1"',
        "oifname", '"orch-br.1"', "accept", "comment", '"orch-bridge:orch-br.1"',
    ]  # fmt: skip


def test_nft_open_chains_and_odd_names() -> None:
    open_chain, named = fw.parse_nft_json(
        nft_doc(chain("inet", "filter", "forward"), chain("inet", "my table", "fwd", "drop"))
    )
    assert fw.nft_open(open_chain) and fw.nft_drops(open_chain) == ""
    assert not named.addressable  # a name nft's command line would not take as it is
    assert fw.parse_nft_json("not json") == [] and fw.parse_nft_json('{"nftables": 3}') == []


def test_nothing_to_say_without_br_netfilter() -> None:
    dropping = [fw.Finding("iptables-nft FORWARD", "policy DROP", False)]
    verdict = fw.forward_verdict("orchbr0", None, dropping, in_use=True, stale=[])
    assert verdict.ok and verdict.detail.startswith("br_netfilter is not loaded")
    off = fw.forward_verdict("orchbr0", "0", dropping, in_use=True, stale=[])
    assert off.ok and "bridge-nf-call-iptables=0" in off.detail


def test_docker_s_drop_is_handled_by_orch_s_rule() -> None:
    allowed = [fw.Finding("iptables-nft FORWARD", "policy DROP", True)]
    verdict = fw.forward_verdict("orchbr0", "1", allowed, in_use=True, stale=[])
    assert verdict.ok and "policy DROP" in verdict.detail and "in place now" in verdict.detail
    before = fw.forward_verdict("orchbr0", "1", [fw.Finding("x", "policy DROP", False)],
                                in_use=False, stale=[])  # fmt: skip
    assert before.ok and "added when nodes start" in before.detail


def test_running_nodes_without_the_rule_are_cut_off_and_reconcile_fixes_it() -> None:
    missing = [fw.Finding("iptables-nft FORWARD", "policy DROP", False)]
    verdict = fw.forward_verdict("orchbr0", "1", missing, in_use=True, stale=[])
    assert not verdict.ok and "cannot reach each other" in verdict.detail
    assert "orch reconcile" in verdict.fix


def test_a_chain_orch_cannot_change_is_not_ready_with_the_fix() -> None:
    blocked = [fw.Finding("nft inet my table fwd", "policy drop", False, managed=False)]
    verdict = fw.forward_verdict("orchbr0", "1", blocked, in_use=False, stale=["a b"])
    assert not verdict.ok and verdict.needed
    assert "orch cannot add its rule to nft inet my table fwd" in verdict.detail
    assert "iptables -I FORWARD -i orchbr0 -o orchbr0 -j ACCEPT" in verdict.fix
    assert "gone bridges remain (a b)" in verdict.detail


def test_a_firewall_orch_cannot_read_is_a_note() -> None:
    unread = [fw.Finding("iptables-legacy", "", False, managed=False, unread="not installed")]
    verdict = fw.forward_verdict("orchbr0", "1", unread, in_use=True, stale=[])
    assert not verdict.ok and not verdict.needed
    assert "orch cannot read iptables-legacy (not installed)" in verdict.detail
    assert "apt-get install iptables" in verdict.fix


def test_an_open_firewall_lets_it_through() -> None:
    verdict = fw.forward_verdict(
        "orchbr0", "1", [fw.Finding("iptables-nft FORWARD", "", False)], in_use=True, stale=[]
    )
    assert verdict.ok and "iptables-nft FORWARD" in verdict.detail
