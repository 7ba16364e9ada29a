"""Every job kind this build of fedpeer knows: the one place that lists them. A new kind is one
folder under fedpeer/kinds/ and one line below.

Each kind's module keeps heavy imports (scikit-learn, xgboost) inside its functions, so an idle
daemon stays small; commands that need no kind (`status`, `peer list`) never import this list.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

from fedpeer.config.load import EVERY_KIND, Config, Policy, load
from fedpeer.errors import ConfigError
from fedpeer.jobs.kind import JobKind
from fedpeer.wire.schema import register_declared


@cache
def job_kinds() -> dict[str, JobKind]:
    """name -> JobKind, in the order `fedpeer run --help` lists them."""
    from fedpeer.jobs import messages  # noqa: F401  (registers the lifecycle messages with the wire)
    from fedpeer.kinds.cluster.dbscan import KIND as dbscan
    from fedpeer.kinds.cluster.gmm import KIND as gmm
    from fedpeer.kinds.cluster.kmeans import KIND as kmeans
    from fedpeer.kinds.forest.bofrf import KIND as bofrf
    from fedpeer.kinds.linear.logreg import KIND as logreg
    from fedpeer.kinds.linear.mlp import KIND as mlp
    from fedpeer.kinds.stats import KIND as stats
    from fedpeer.kinds.sumcheck import KIND as sumcheck
    from fedpeer.kinds.tree.kind import KIND as tree
    from fedpeer.kinds.xgboost.kind import KIND as xgboost

    kinds = {k.name: k for k in (stats, sumcheck, bofrf, xgboost, tree, logreg, mlp, kmeans, gmm, dbscan)}
    for kind in kinds.values():
        register_declared(kind.messages)
    return kinds


def check_config(config: Config, kinds: dict[str, JobKind] | None = None) -> Config:
    """The parts of peers.toml only the catalogue can judge: [policy] allowed_jobs names known
    kinds, and every [policy.<kind>] table a known kind's limits. ConfigError naming the key, as
    `load` does for the rest; the config itself when it passes."""
    kinds = job_kinds() if kinds is None else kinds
    known = ", ".join(kinds)
    for name in config.policy.allowed_jobs:
        if name != EVERY_KIND and name not in kinds:
            raise ConfigError(config.path, "policy.allowed_jobs", f"unknown job kind {name!r}; known kinds: {known}")
    for name, table in config.policy.limits.items():
        kind = kinds.get(name)
        if kind is None:
            keys = {f.name for f in dataclasses.fields(Policy)} - {"limits"} | set(kinds)
            raise ConfigError(config.path, f"policy.{name}", f"unknown key (known: {', '.join(sorted(keys))})")
        unknown = kind.check_table(table)
        if unknown is not None:
            raise ConfigError(config.path, f"policy.{name}.{unknown}",
                              f"unknown key (known: {', '.join(sorted(kind.limits))})")
    return config


def load_config(path: Path | str) -> Config:
    """peers.toml as the daemon runs it: `load`, then `check_config`."""
    return check_config(load(path))
