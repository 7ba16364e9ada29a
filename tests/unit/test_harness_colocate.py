"""Co-located sites' timings (fedpeer/app/harness/colocate.py): the defaults up to
SITES_PER_CORE_AT_DEFAULTS a core, then every period in proportion, and always a valid peers.toml."""

from __future__ import annotations

import pytest

from fedpeer.app.harness.colocate import SITES_PER_CORE_AT_DEFAULTS, colocated_settings, slowdown
from fedpeer.config.load import SITE_ELECTION, JobLimits, MembershipTiming
from fedpeer.core.election.raft import ElectionConfig


def test_the_defaults_hold_up_to_the_sites_a_machine_carries() -> None:
    assert SITES_PER_CORE_AT_DEFAULTS == 20
    assert slowdown(40, 2) == 1.0 and colocated_settings(40, 2) == {} and colocated_settings(5, 1) == {}
    assert slowdown(100, 2) == 2.5 and slowdown(70, 2) == 1.75 and slowdown(100, 8) == 1.0


@pytest.mark.parametrize(("sites", "cores"), [(41, 2), (70, 2), (100, 2), (100, 1)])
def test_every_period_grows_in_proportion_and_the_result_loads(sites: int, cores: int) -> None:
    s = colocated_settings(sites, cores)
    factor = sites / (cores * SITES_PER_CORE_AT_DEFAULTS)
    timing = MembershipTiming(**s["membership"])          # its own consistency checks pass
    election = ElectionConfig(**s["election"])
    assert timing.probe_interval_ms == pytest.approx(MembershipTiming().probe_interval_ms * factor, abs=1)
    assert timing.probe_timeout_ms < timing.probe_interval_ms
    assert election.heartbeat_interval_ms == pytest.approx(SITE_ELECTION.heartbeat_interval_ms * factor, abs=1)
    assert 2 * election.heartbeat_interval_ms <= election.election_timeout_min_ms
    assert timing.indirect_probes == MembershipTiming().indirect_probes     # counts are not periods
    assert timing.tick_ms == pytest.approx(MembershipTiming().tick_ms * factor, abs=1)
    assert JobLimits(**s["jobs"]).hop_timeout_ms == pytest.approx(JobLimits().hop_timeout_ms * factor, abs=1)
