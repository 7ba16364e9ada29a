"""Histogram mode's state so far, for a member back in the job (fedpeer/protocols/epochs.py,
"Rejoins"): what every member agreed before the resume point — the federation's training rows
and label statistics, the base score, the cut points and the finished trees — as one byte string
that is the same at every member that never left (its digest is what the member back in checks),
and its careful reading there.

The state's bytes: a msgpack map with fixed keys, arrays as little-endian raw bytes and the trees
as one trees document (fedpeer/ml/xgb/tree.py, one class per tree so that a partial round
travels too). Reading checks every size against the job's own parameters before anything is
built: a state that does not fit fails that member's rejoin only (JobError), never the job."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from fedpeer.errors import JobError
from fedpeer.ml.xgb.histboost import HistParams
from fedpeer.ml.xgb.sketch import Cuts
from fedpeer.ml.xgb.tree import _parse_trees, _trees_doc, _Tree
from fedpeer.protocols.epochs import STATE_BYTES_MAX

KEYS = ("rows", "base", "labels", "cut_values", "cut_ptr", "max_bin", "trees")
LABEL_STATS_MAX = 1 << 16        # int64 label statistics (histboost.label_stats: a few per class)
LEAF_ABS_MAX = 3.4e38            # the leaves are float32: their digest, not a bound, vouches for them
# The earliest a member may come back: with fewer trees left than this, the job is too near its
# end (a tree costs a resume sum, and the state's transfer, for every member)
REJOIN_TREES_LEFT_MIN = 2


@dataclass(frozen=True)
class HistState:
    rows: int
    base: tuple[float, ...]
    labels: np.ndarray
    cuts: Cuts
    trees: list[_Tree]


def encode_state(rows: int, base: Sequence[float], labels: np.ndarray, cuts: Cuts, trees: Sequence[_Tree]) -> bytes:
    """The state's bytes: the same at every member that holds the same state."""
    return msgpack.packb({
        "rows": int(rows), "base": [float(b) for b in base],
        "labels": np.ascontiguousarray(labels, dtype="<i8").tobytes(),
        "cut_values": np.ascontiguousarray(cuts.values, dtype="<f4").tobytes(),
        "cut_ptr": np.ascontiguousarray(cuts.ptr, dtype="<i8").tobytes(),
        "max_bin": int(cuts.max_bin), "trees": _trees_doc(list(trees), 1)}, use_bin_type=True)


def decode_state(data: bytes, p: HistParams, n_features: int, trees: int) -> HistState:
    """A state received from a member, for a job of parameters `p` over `n_features` features,
    with exactly `trees` finished trees; JobError naming what does not fit."""
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=STATE_BYTES_MAX,
                              max_str_len=1024, max_array_len=1 << 16, max_map_len=len(KEYS))
        return _checked(doc, p, n_features, trees)
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
        raise JobError(f"the model so far failed its checks ({type(exc).__name__}: {str(exc)[:200]})") from None


def _checked(doc: Any, p: HistParams, n_features: int, trees: int) -> HistState:
    if not isinstance(doc, dict) or set(doc) != set(KEYS):
        raise ValueError(f"the state must be a map of {', '.join(KEYS)}")
    rows, base, max_bin = doc["rows"], doc["base"], doc["max_bin"]
    if not isinstance(rows, int) or isinstance(rows, bool) or not 1 <= rows < 2**62:
        raise ValueError("rows out of range")
    if not isinstance(base, list) or len(base) != p.groups or not all(isinstance(b, float) for b in base) \
            or not np.all(np.isfinite(base)):
        raise ValueError(f"the base score must be {p.groups} finite number(s)")
    if max_bin != p.max_bin:
        raise ValueError("the cut points' bins differ from the job's max_bin")
    labels = _array(doc["labels"], "<i8", LABEL_STATS_MAX, "label statistics")
    values = _array(doc["cut_values"], "<f4", n_features * p.max_bin, "cut values")
    ptr = _array(doc["cut_ptr"], "<i8", n_features + 1, "cut pointers")
    if len(ptr) != n_features + 1 or ptr[0] != 0 or ptr[-1] != len(values) or np.any(np.diff(ptr) < 0) \
            or np.any(np.diff(ptr) > p.max_bin):
        raise ValueError("the cut pointers do not index the cut values feature by feature")
    if not np.all(np.isfinite(values)):
        raise ValueError("a cut value is not finite")
    if not isinstance(doc["trees"], bytes):
        raise ValueError("the trees must be a trees document")
    batch = _parse_trees(doc["trees"], num_feature=n_features, groups=1, expected=trees, trees_max=max(trees, 1),
                         nodes_max=2 ** (p.max_depth + 1), depth_max=p.max_depth, leaf_abs_max=LEAF_ABS_MAX)
    return HistState(rows, tuple(base), labels.astype(np.int64),
                     Cuts(values=values.astype(np.float32), ptr=ptr.astype(np.int64), max_bin=int(max_bin)),
                     list(batch.trees))


def _array(raw: Any, dtype: str, count_max: int, what: str) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    if not isinstance(raw, bytes) or len(raw) % size or len(raw) // size > count_max:
        raise ValueError(f"the {what} have the wrong size")
    return np.frombuffer(raw, dtype=dtype).copy()
