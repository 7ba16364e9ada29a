"""`tree` with mode `icdta`: ICDTA4FL (Argente-Garrido et al., Information Sciences 694, 2025)
without a server, over the job's Channel; its arithmetic is fedpeer/ml/tree/icdta.py.

Every member runs the same steps (tags tree/e<E>/..., epoch E as in the exact mode):
1. trains its own scikit-learn DecisionTreeClassifier (the job's criterion, max_depth,
   min_leaf_rows as min_samples_leaf, ccp_alpha) on its training part;
2. sends it to every other member (`LocalTree`: its structure and each leaf's class) and checks
   every tree it receives (fedpeer/ml/tree/icdta.py `read_tree`); a tree that fails the check, or
   does not arrive within TREE_RECV_TIMEOUT_HOPS hop timeouts, is not held — its sender stays a
   member;
3. one secure sum, icdta/scores: per member's tree whether this member holds it, and its confusion
   matrix on this member's test part (training rows with test_fraction 0) — the owner gives its
   rows instead of scoring its own tree. A tree counts only if every member holds it (the same
   trees everywhere); the totals are checked (`checked_total`);
4. the filter (`icdta_threshold`), the Cartesian product of the kept trees' rules (RULES_MAX, else
   the job ends naming max_depth), then one secure sum, icdta/rules: each rule's class counts on
   the training parts; rules no row matches are dropped; the global tree is built from the rest;
5. the global tree is scored as the exact tree is (tree/e<E>/eval) and stored as the exact tree
   is (model.json: `fedpeer predict`, `fedpeer export`); `job show` prints the aggregated rules.

A member lost in a sum: every survivor starts epoch E + 1 and runs the steps again from 2 over
the survivors (their local trees unchanged).

Who learns what: every member learns every other member's tree (its splits and its leaves'
classes, as in the paper, where the server sends every client every tree), each tree's
federation-wide confusion matrix (not any site's), and each aggregated rule's class counts over
the federation's training rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedpeer.errors import JobError, LocalProtocolError
from fedpeer.jobs.kind import JobContext, JobFailsEverywhere, checked_total, site_seed
from fedpeer.kinds.tree.job import COUNT_MAX, TreeJob, finish_result
from fedpeer.ml.tree import icdta
from fedpeer.protocols.epochs import Lost as _Lost
from fedpeer.protocols.fixedpoint import encode_counts
from fedpeer.protocols.securesum.wire import VECTOR_ENTRIES_MAX
from fedpeer.runtime.channel import MalformedFrom, PeerDead
from fedpeer.wire import frame as wire

TREE_RECV_TIMEOUT_HOPS = 4         # waiting for a member's tree: this many hop timeouts
TAG_BYTES_MAX = 256


@dataclass(frozen=True)
class LocalTree:
    tag: str
    tree: Any            # {feature, threshold, left, right, klass}: checked by the receiving job (read_tree)
    WAITING_FOR: ClassVar[str] = "local tree"


# the arrays' shapes and values are the receiving job's to check (read_tree): it knows the classes and features
_tree_field = wire.v_map({name: wire.v_array(icdta.LOCAL_NODES_MAX,
                                             frozenset({"<f8" if name == "threshold" else "<i8"}))
                          for name in icdta.DOC_ARRAYS})


MESSAGES = (
    wire.declare("tree_local", LocalTree, {"tag": wire.v_str(TAG_BYTES_MAX), "tree": _tree_field},
                 to_body=lambda m: {"tag": m.tag, "tree": {k: wire.encode_array(v) for k, v in m.tree.items()}}),
)


def refusal(params: Mapping[str, Any]) -> str | None:
    """Why these parameters cannot run in mode icdta (None: they can)."""
    if params["criterion"] == "squared_error":
        return "tree: mode icdta aggregates classification trees; use criterion gini or entropy (or mode exact)"
    return None


class IcdtaJob:
    """One member's run of ICDTA4FL (module docstring) on a TreeJob's split, sums and evaluation."""

    def __init__(self, job: TreeJob, own: Any) -> None:
        self.job, self.own = job, own
        self.k = len(job.classes)
        self.doc = icdta.tree_doc(own)       # what this member sends of its tree
        self.evidence: dict[str, dict[str, str]] = {}

    async def exchange(self) -> list[Any]:
        """Every current member's tree in member order (None: not held here), after sending ours."""
        job, ch = self.job, self.job.ch
        tag = job.epochs.tag("icdta/tree")
        others = [m for m in job.members if m != ch.me]
        refused: dict[str, str] = {}
        undelivered: dict[str, str] = {}
        not_sent: dict[str, str] = {}
        doc = self.doc

        async def send(peer: bytes) -> None:
            try:
                await ch.send(peer, LocalTree(tag=tag, tree=doc))
            except (JobError, LocalProtocolError) as exc:
                not_sent[job.name(peer)] = str(exc)[:200]

        async def receive(peer: bytes) -> Any:
            try:
                _, msg = await ch.recv(LocalTree, tag, src=peer,
                                       timeout_ms=TREE_RECV_TIMEOUT_HOPS * job.ctx.hop_timeout_ms)
            except MalformedFrom as exc:
                refused[job.name(peer)] = exc.reason
                return None
            except PeerDead as exc:
                undelivered[job.name(peer)] = exc.detail
                return None
            except JobError as exc:
                undelivered[job.name(peer)] = str(exc)[:200]
                return None
            try:
                return icdta.read_tree(msg.tree, job.fit[0].shape[1], self.k, job.p.max_depth, job.p.criterion)
            except ValueError as exc:
                refused[job.name(peer)] = str(exc)
                return None

        got = await asyncio.gather(*(send(p) for p in others), *(receive(p) for p in others))
        received = dict(zip(others, got[len(others):]))
        self.evidence = {"trees_refused": refused, "trees_undelivered": undelivered, "own_tree_not_sent_to": not_sent}
        return [self.own if m == ch.me else received[m] for m in job.members]

    async def run(self) -> tuple[Any, dict]:
        job, params = self.job, self.job.params
        members = job.members
        trees = await self.exchange()
        job.ch.progress("icdta: scoring every tree", 1, 4)
        X, y = job.test
        width = len(members) * (2 + self.k * self.k) + 1
        if width > VECTOR_ENTRIES_MAX:
            raise JobFailsEverywhere(f"tree: the scores of {len(members)} trees and {self.k} classes are more numbers "
                                     f"than one secure sum carries ({VECTOR_ENTRIES_MAX})")
        vector = await job.compute(icdta.score_vector, trees, members.index(job.ch.me), X, y, self.k)
        tag, total = await job.sum("icdta/scores", encode_counts(vector, len(members), COUNT_MAX))
        scores = checked_total(tag, icdta.read_scores, total, len(members), self.k, len(members))
        kept, fallback = icdta.select(scores, params["icdta_threshold"])
        if not kept:
            raise JobFailsEverywhere("tree: no member's tree reached every member (see trees_refused); "
                                     "no global tree")
        job.ch.progress("icdta: aggregating the rules", 2, 4)
        try:
            rules = await job.compute(icdta.combine, [trees[t] for t in kept])
        except icdta.TooManyRules as exc:
            raise JobFailsEverywhere(f"tree: the {len(kept)} kept trees' rules combine into more than "
                                     f"{icdta.RULES_MAX} rules ({exc.count} and counting); lower max_depth "
                                     f"(now {params['max_depth']})") from None
        if len(rules) * self.k + self.k > VECTOR_ENTRIES_MAX:
            raise JobFailsEverywhere(f"tree: {len(rules)} rules x {self.k} classes are more numbers than one secure "
                                     f"sum carries; lower max_depth (now {params['max_depth']})")
        counts_vector = await job.compute(icdta.rule_counts, rules, *job.fit, self.k)
        tag, total = await job.sum("icdta/rules", encode_counts(counts_vector, len(members), COUNT_MAX))
        counts, classes = checked_total(tag, icdta.read_rule_counts, total, len(rules), self.k)
        matched = counts.sum(axis=1) > 0
        rules, counts = rules.take(matched), counts[matched]
        job.ch.progress("icdta: the global tree", 3, 4)
        try:
            cart = await job.compute(icdta.rules_to_tree, rules, counts, job.p.criterion)
        except icdta.TooManyNodes as exc:
            raise JobFailsEverywhere(f"tree: {exc}; lower max_depth (now {params['max_depth']})") from None
        job.rows = int(classes.sum())
        names = [job.name(m) for m in members]
        info = {
            "trees": {names[t]: {"held_by_every_member": bool(scores.agreed[t]), "kept": t in kept,
                                 "scored_rows": int(scores.rows[t]), "accuracy": _figure(scores.accuracy[t]),
                                 "macro_f1": _figure(scores.f1[t])}
                      for t in range(len(members))},
            "trees_kept": [names[t] for t in kept], "filter_fallback": fallback,
            "rules_combined": int(len(matched)), "rules_kept": int(len(rules)),
            "rules_text": icdta.rule_lines(rules, counts, list(job.ctx.data.features), job.classes,
                                           params["min_leaf_rows"]),
            **self.evidence,
        }
        return cart, info


def _figure(value: float) -> float | None:
    return None if np.isnan(value) else round(float(value), 6)


async def run_icdta(ch: Any, params: Mapping[str, Any], ctx: JobContext, offload: Callable[..., Any]) -> dict:
    """The tree kind's run() in mode icdta (module docstring)."""
    why = refusal(params)
    if why is not None:
        raise JobFailsEverywhere(why)
    job = TreeJob(ch, params, ctx, offload)
    ch.progress("icdta: the local tree", 0, 4)
    own = await job.compute(icdta.local_tree, *job.fit, len(job.classes), params["criterion"], params["max_depth"],
                            params["min_leaf_rows"], params["ccp_alpha"], site_seed(params["seed"], ch.me))
    while True:
        try:
            cart, info = await IcdtaJob(job, own).run()
            lost = await job.epochs.finish()     # with views: did every survivor get here too?
            if not lost:
                break
            job.lose(lost)                       # one's last sum failed: all run it again
        except _Lost:
            continue
    every = info.pop("rules_text")
    out: dict[str, Any] = {
        "mode": "icdta", "criterion": params["criterion"], "max_depth": params["max_depth"],
        "min_leaf_rows": params["min_leaf_rows"], "ccp_alpha": params["ccp_alpha"],
        "icdta_threshold": params["icdta_threshold"], "icdta": info,
    }
    return await finish_result(job, cart, every, out)


RULES_SHOWN_MAX = 64       # aggregated rules `job show` prints; the rest are in the result


def describe(result: Mapping[str, Any]) -> list[str]:
    """`fedpeer job show` lines of an icdta result: the trees kept, the global tree, its AUC, the rules."""
    from fedpeer.jobs.report import score
    from fedpeer.kinds.tree.text import rule_lines

    info = result["icdta"]
    lost = ", ".join(result.get("lost") or []) or "none"
    kept = ", ".join(info["trees_kept"])
    rule = (f"accuracy >= {result['icdta_threshold']:g}" if result["icdta_threshold"] > 0
            else "accuracy and macro-F1 at least the mean")
    lines = [f"  tree (icdta): {len(info['trees'])} local trees, kept {kept} ({rule}"
             f"{'; none passed: the best kept' if info['filter_fallback'] else ''}); {info['rules_kept']} "
             f"aggregated rules; global tree depth {result['depth']}, {result['n_leaves']} leaves; "
             f"{result['secure_sums']} secure sums over {', '.join(result['members'])}; members lost: {lost}",
             f"  AUC {score(result.get('auc'))} ({result.get('score_source') or '-'}); model file "
             f"{result.get('model_file', '-')}"]
    for name, t in info["trees"].items():
        lines.append(f"  {name}'s tree: accuracy {score(t['accuracy'])}, macro-F1 {score(t['macro_f1'])} on "
                     f"{t['scored_rows']} rows of the others{'; kept' if t['kept'] else ''}")
    for field, said in (("trees_refused", "refused"), ("trees_undelivered", "not received")):
        for name, why in (info.get(field) or {}).items():
            lines.append(f"  {name}'s tree {said} here: {why}")
    rules = list(result.get("rules") or [])
    lines.append(f"  rules ({len(rules) + result.get('rules_omitted', 0)}; rows are the federation's training rows):")
    lines += rule_lines(result, rules[:RULES_SHOWN_MAX])
    more = len(rules) - RULES_SHOWN_MAX + result.get("rules_omitted", 0)
    if more > 0:
        lines.append(f"    ... and {more} more (the job's result)")
    return lines
