"""A re-read peers.toml: what fedpeer/daemon/reload.py says changed, and what the job registry does
with a removed member's jobs and with the proposer's map of missing pairs (no daemon)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from fedpeer.config.load import Address, Config, DataSection, Limits, MembershipTiming, PeerEntry, Policy
from fedpeer.daemon.reload import applicable, check_data, compare, one_line
from fedpeer.errors import ConfigError
from fedpeer.jobs import messages as m
from fedpeer.jobs.lifecycle.registry import JobRegistry
from tests.unit.test_job_registry import (
    ALICE,
    BOB,
    KINDS,
    NAMES,
    FakeTransport,
    make_config,
    running_job,
    sent_of,
    settle,
)

A, B, C, D = (bytes([i]) * 32 for i in (1, 2, 3, 4))


def peer(name: str, key: bytes, port: int = 7000) -> PeerEntry:
    return PeerEntry(name=name, address=Address("10.0.0.1", port), public_key=key)


def with_peers(config: Config, *peers: PeerEntry, **changes: object) -> Config:
    return dataclasses.replace(config, peers=tuple(peers), **changes)


def test_peers_are_compared_by_key(tmp_path: Path) -> None:
    old = with_peers(make_config(tmp_path), peer("a", A), peer("b", B), peer("c", C))
    new = with_peers(old, peer("a", A, 7001), peer("b", D), peer("see", C), peer("d", bytes([9]) * 32))
    c = compare(old, new)
    assert (c.added, c.removed, c.rotated, c.moved, c.renamed) == (("d",), (), ("b",), ("a",), (("c", "see"),))
    assert c.summary()["peers"] == "+d, b new key, a new address, c renamed see"
    gone = compare(old, with_peers(old, peer("a", A)))
    assert one_line(gone.summary()) == ("peers: -b, -c; policy: unchanged; data: unchanged; limits: unchanged; "
                                        "jobs: unchanged; membership: unchanged; election: unchanged")


def test_sections_node_and_start_time_limits(tmp_path: Path) -> None:
    old = make_config(tmp_path)
    node = dataclasses.replace(old.node, name="renamed")
    new = dataclasses.replace(old, node=node, policy=Policy(allowed_jobs=("noop",)),
                              limits=Limits(send_retries_max=9, inbound_concurrent_max=3),
                              membership=MembershipTiming(suspect_timeout_ms=9_000))
    summary = compare(old, new).summary()
    assert summary["policy"] == summary["membership"] == "changed" and summary["data"] == "unchanged"
    assert summary["limits"] == "changed (inbound_concurrent_max apply at the next start)"
    assert summary["node"] == "changed: needs a restart (not applied)"
    running = applicable(old, new)
    assert running.node == old.node and running.limits.send_retries_max == 9
    assert running.limits.inbound_concurrent_max == old.limits.inbound_concurrent_max


async def test_a_removed_members_running_job_fails_naming_the_removal_and_the_others_hear(tmp_path: Path) -> None:
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task)
        record = await running_job(registry, "r-1", "waits")   # members: alice (proposer), bob, me
        other = await running_job(registry, "r-2", "waits")
        assert record.state == "running"
        ended = registry.reconfigure(registry.config, {k: n for k, n in NAMES.items() if k != BOB})
        await settle()
        assert sorted(ended) == ["r-1", "r-2"]
        assert record.state == "failed" and record.error == "bob: removed from site-me's peers.toml"
        aborts = sent_of(transport, m.JobAbort)
        assert {dst for dst, _ in aborts} == {ALICE}, "the removed member is never addressed"
        assert all(msg.site == BOB for _, msg in aborts)
        assert other.state == "failed"


async def test_the_proposer_names_every_missing_pair_by_its_own_names(tmp_path: Path) -> None:
    from fedpeer.identity import fingerprint

    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task)
        job_id = registry.propose("noop", {}, ["alice", "bob"])
        await settle()
        registry.on_message(ALICE, job_id, m.JobReject(
            job_id=job_id, reason=f"member(s) {fingerprint(BOB)} not in this site's peers.toml; add them"))
        registry.on_message(BOB, job_id, m.JobReject(
            job_id=job_id, reason="unreachable: peer 00 unreachable: 10.0.0.2:7 refused the frame: unknown_sender"))
        await asyncio.sleep(1.2)   # the abort grace
    error = registry.show(job_id)["error"]
    assert error == ("site-me: alice does not list bob: run `fedpeer peer add` there; "
                     "bob does not list site-me: run `fedpeer peer add` there"), error


def test_a_changed_data_section_is_checked_against_its_csv_as_init_checks_it(tmp_path: Path) -> None:
    """A reload whose [data] names a column the CSV lacks, or a file that is not there, is refused
    in one line naming the key and the fix (the node then keeps the old configuration)."""
    csv = tmp_path / "cohort.csv"
    csv.write_text("Id,age,Diagnosis\n1,50,M\n")
    old = dataclasses.replace(make_config(tmp_path), data=DataSection(csv=str(csv), label="Diagnosis"))
    check_data(old, old)
    check_data(old, dataclasses.replace(old, data=DataSection(csv=str(csv), label="Diagnosis", ignore=("Id",))))
    for data, key, words in ((DataSection(csv=str(csv), label="diagnosis"), "data.label",
                              ["did you mean 'Diagnosis'?", "'Id', 'age', 'Diagnosis'", "fix [data] label"]),
                             (DataSection(csv=str(csv), label="Diagnosis", ignore=("ID",)), "data.ignore",
                              ["did you mean 'Id'?"]),
                             (DataSection(csv=str(tmp_path / "gone.csv"), label="Diagnosis"), "data.csv",
                              ["file not found", "an existing CSV"])):
        with pytest.raises(ConfigError) as err:
            check_data(old, dataclasses.replace(old, data=data))
        assert err.value.key == key and "\n" not in str(err.value)
        assert all(w in err.value.problem for w in words), err.value.problem
    gone = dataclasses.replace(old, data=DataSection(csv=str(tmp_path / "gone.csv"), label="Diagnosis"))
    check_data(gone, gone)    # unchanged: the running [data] is not re-judged by an unrelated edit
