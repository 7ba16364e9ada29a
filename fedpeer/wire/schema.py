"""Message schema: what each message kind looks like on the wire, checked field by field.

Every message kind is registered here once (`register`), with a validator per field built from the
small composable validators below (each `(value, where) -> value`, raising `RemoteProtocolError`
with reason "schema"). The gate (fedpeer/wire/frame.py) checks an envelope's body against its kind's
schema before anything builds a typed message from it. Arrays travel as {dtype (allow-list),
shape, data} and are decoded without copies. Job kinds register their own messages from their
modules; membership's and the election's are registered here, beside the cores they serve.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fedpeer.core.membership import swim as mb
from fedpeer.errors import LocalProtocolError, RemoteProtocolError
from fedpeer.identity import PUBLIC_KEY_BYTES, SIGNATURE_BYTES

INT64_MAX = 2**63 - 1


# ---------------------------------------------------------------------------------------------
# Typed validation: small composable validators, each `(value, where) -> value`.
# ---------------------------------------------------------------------------------------------

Validator = Callable[[Any, str], Any]


def _bad(where: str, problem: str) -> RemoteProtocolError:
    return RemoteProtocolError("schema", f"{where}: {problem}")


def v_int(lo: int = 0, hi: int = INT64_MAX) -> Validator:
    def check(value: Any, where: str) -> int:
        if type(value) is int and lo <= value <= hi:   # what msgpack decodes: no isinstance calls
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise _bad(where, f"expected an integer in [{lo}, {hi}]")
        return value
    return check


def v_float(lo: float = -math.inf, hi: float = math.inf) -> Validator:
    def check(value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(where, "expected a number")
        if not math.isfinite(value) or not lo <= value <= hi:
            raise _bad(where, f"expected a finite number in [{lo}, {hi}]")
        return float(value)
    return check


def v_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(where, "expected a boolean")
    return value


UTF8_BYTES_PER_CHAR_MAX = 4   # (a surrogate, passed: 3)


def v_str(max_bytes: int = 1024, choices: frozenset[str] | None = None) -> Validator:
    short = max_bytes // UTF8_BYTES_PER_CHAR_MAX     # strings this short fit whatever they hold: not encoded

    def check(value: Any, where: str) -> str:
        if not isinstance(value, str) or (len(value) > short
                                          and len(value.encode("utf-8", "surrogatepass")) > max_bytes):
            raise _bad(where, f"expected a string of at most {max_bytes} bytes")
        if choices is not None and value not in choices:
            raise _bad(where, f"expected one of {sorted(choices)}")
        return value
    return check


class RawBytes:
    """A large bytes-like value that travels after the message's msgpack part, not inside it
    (fedpeer/wire/frame.py `pack`): no copy into msgpack on the way out; on the way in it is a view
    of the decrypted frame (a writable numpy array, for arrays)."""

    __slots__ = ("view",)
    BYTES_MIN = 64 * 1024      # smaller values stay inside msgpack

    def __init__(self, view: memoryview) -> None:
        self.view = view


def v_bytes(exact: int | None = None, max_bytes: int | None = None, *, view: bool = False) -> Validator:
    """Bytes. A large value sent after the msgpack part (RawBytes) arrives as a view of the
    decrypted frame: copied into `bytes`, or with `view` kept as a read-only memoryview (for a
    field whose bytes are only read, or copied elsewhere anyway: no second copy of a MiB)."""
    def check(value: Any, where: str) -> bytes | memoryview:
        if isinstance(value, memoryview):
            value = value.toreadonly() if view else bytes(value)
        elif not isinstance(value, bytes):
            raise _bad(where, "expected bytes")
        if exact is not None and len(value) != exact:
            raise _bad(where, f"expected exactly {exact} bytes")
        if max_bytes is not None and len(value) > max_bytes:
            raise _bad(where, f"expected at most {max_bytes} bytes")
        return value
    return check


def v_list(item: Validator, max_len: int) -> Validator:
    def check(value: Any, where: str) -> list:
        if not isinstance(value, list) or len(value) > max_len:
            raise _bad(where, f"expected a list of at most {max_len} items")
        return [item(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return check


def v_map(fields: Mapping[str, Validator], optional: frozenset[str] = frozenset()) -> Validator:
    """A map with exactly these string keys (those in `optional` may be absent). The fields are
    taken as they are when the validator is made (it runs for every map of every message: its key
    sets are built once, and a map holding exactly the fields is told by one comparison)."""
    keys = frozenset(fields)
    required = keys - optional
    items = tuple(fields.items())

    def check(value: Any, where: str) -> dict:
        if not isinstance(value, dict):
            raise _bad(where, "expected a map")
        if value.keys() != keys:
            extra = value.keys() - keys
            if extra:
                raise _bad(where, f"unexpected keys {sorted(map(str, extra))[:5]}")
            missing = required - value.keys()
            if missing:
                raise _bad(where, f"missing keys {sorted(missing)}")
        checked = {}
        for k, field in items:   # (a loop, not a comprehension: one call less per map of every message)
            if k in value:
                checked[k] = field(value[k], f"{where}.{k}")
        return checked
    return check


NODE_ID = v_bytes(exact=PUBLIC_KEY_BYTES)


def _v_buffer(value: Any, where: str) -> bytes | memoryview:
    """An array's bytes: inside msgpack (bytes) or after it (a view, kept as it is: no copy)."""
    if not isinstance(value, (bytes, memoryview)):
        raise _bad(where, "expected bytes")
    return value


# ---------------------------------------------------------------------------------------------
# Message registry: kind -> how a typed message becomes a body and back.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MessageSpec:
    kind: str
    cls: type
    schema: Validator
    to_body: Callable[[Any], dict]
    from_body: Callable[[dict], Any]


_BY_KIND: dict[str, MessageSpec] = {}
_BY_CLASS: dict[type, MessageSpec] = {}


def register(kind: str, cls: type, fields: Mapping[str, Validator], *,
             to_body: Callable[[Any], dict] | None = None,
             from_body: Callable[[dict], Any] | None = None) -> None:
    """Declare a message kind. Default codec: the dataclass fields, one key each."""
    assert kind not in _BY_KIND and cls not in _BY_CLASS, f"message kind {kind} registered twice"
    spec = MessageSpec(
        kind=kind, cls=cls, schema=v_map(fields),
        to_body=to_body or (lambda m: {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}),
        from_body=from_body or (lambda body: cls(**body)),
    )
    _BY_KIND[kind] = spec
    _BY_CLASS[cls] = spec


@dataclass(frozen=True)
class Declared:
    """A message kind declared by a job kind (its `messages`) and registered by the job catalogue
    (fedpeer/kinds/catalog.py), not by importing the module that defines it."""

    kind: str
    cls: type
    fields: Mapping[str, Validator]
    to_body: Callable[[Any], dict] | None = None
    from_body: Callable[[dict], Any] | None = None


def declare(kind: str, cls: type, fields: Mapping[str, Validator], *,
            to_body: Callable[[Any], dict] | None = None,
            from_body: Callable[[dict], Any] | None = None) -> Declared:
    return Declared(kind, cls, fields, to_body, from_body)


def register_declared(messages: Iterable[Declared]) -> None:
    """Register declared message kinds; one already registered for the same class is left as it is
    (the catalogue may be built more than once in a process)."""
    for m in messages:
        spec = _BY_KIND.get(m.kind)
        if spec is not None and spec.cls is m.cls:
            continue
        register(m.kind, m.cls, m.fields, to_body=m.to_body, from_body=m.from_body)


def kind_of(msg: object) -> str:
    spec = _BY_CLASS.get(type(msg))
    if spec is None:
        raise LocalProtocolError("unregistered", f"no wire kind for {type(msg).__name__}")
    return spec.kind


# Membership (fedpeer/core/membership/swim.py) ----------------------------------------------------

_UPDATES_MAX = 64
_ADDRESS = v_str(max_bytes=300)
_UPDATE = v_map({"node": NODE_ID, "state": v_str(16, frozenset(s.value for s in mb.MemberState)),
                 "incarnation": v_int(), "address": _ADDRESS})
_UPDATES = v_list(_UPDATE, _UPDATES_MAX)


def _updates_out(updates: tuple[mb.Update, ...]) -> list[dict]:
    return [{"node": u.node, "state": u.state.value, "incarnation": u.incarnation, "address": u.address}
            for u in updates]


def _updates_in(raw: list[dict]) -> tuple[mb.Update, ...]:
    return tuple(mb.Update(node=u["node"], state=mb.MemberState(u["state"]),
                           incarnation=u["incarnation"], address=u["address"]) for u in raw)


def _register_membership() -> None:
    def to_body(m: Any) -> dict:
        body = {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}
        body["updates"] = _updates_out(m.updates)
        return body

    def from_body(cls: type) -> Callable[[dict], Any]:
        return lambda body: cls(**{**body, "updates": _updates_in(body["updates"])})

    direct = {"probe_id": v_int(), "incarnation": v_int(), "address": _ADDRESS, "updates": _UPDATES}
    indirect = {"probe_id": v_int(), "target": NODE_ID, "updates": _UPDATES}
    for kind, cls, fields in (("ping", mb.Ping, direct), ("ack", mb.Ack, direct),
                              ("ping_req", mb.PingReq, indirect), ("indirect_ack", mb.IndirectAck, indirect)):
        register(kind, cls, fields, to_body=to_body, from_body=from_body(cls))


_register_membership()


def _register_election() -> None:
    from fedpeer.core.election import raft as el

    term = v_int(0, INT64_MAX)
    with_commit = {"term": term, "commit_term": term, "commit_index": term}
    pre_vote_reply = {"term": term, "granted": v_bool}
    # A granted vote carries the voter's signature (empty when refused); a heartbeat carries the
    # votes that elected its sender: at most one per member (the core refuses duplicates).
    vote_reply = {**pre_vote_reply, "sig": v_bytes(max_bytes=SIGNATURE_BYTES)}
    vote = v_map({"voter": NODE_ID, "sig": v_bytes(exact=SIGNATURE_BYTES)})
    heartbeat = {**with_commit, "certificate": v_list(vote, el.MEMBERS_MAX)}

    def heartbeat_out(m: el.Heartbeat) -> dict:
        return {"term": m.term, "commit_term": m.commit_term, "commit_index": m.commit_index,
                "certificate": [{"voter": v.voter, "sig": v.sig} for v in m.certificate]}

    def heartbeat_in(body: dict) -> el.Heartbeat:
        return el.Heartbeat(**{**body, "certificate": tuple(el.VoteSig(**v) for v in body["certificate"])})

    for kind, cls, fields in (("el_pre_vote", el.PreVote, with_commit),
                              ("el_pre_vote_reply", el.PreVoteReply, pre_vote_reply),
                              ("el_request_vote", el.RequestVote, with_commit),
                              ("el_request_vote_reply", el.RequestVoteReply, vote_reply),
                              ("el_heartbeat_reply", el.HeartbeatReply, {"term": term, "follows": v_bool})):
        register(kind, cls, fields)
    register("el_heartbeat", el.Heartbeat, heartbeat, to_body=heartbeat_out, from_body=heartbeat_in)


_register_election()


@dataclass(frozen=True)
class DiagProbe:
    """`fedpeer ping`: a message that only has to pass the gate; its delivery time is the
    transport's latency as a job would see it (sealing, HTTP, the peer's full gate)."""
    payload: bytes | memoryview     # a received large payload is a read-only view of its frame


register("diag_probe", DiagProbe, {"payload": v_bytes(view=True)})   # read by nobody: no copy


# ---------------------------------------------------------------------------------------------
# Arrays on the wire: {dtype (allow-list), shape, data}; length must match exactly.
# ---------------------------------------------------------------------------------------------

ARRAY_DTYPES = frozenset({"<u1", "<i4", "<i8", "<u4", "<u8", "<f4", "<f8", "|b1", "|u1"})
ARRAY_DIMS_MAX = 4


def encode_array(array: Any) -> dict:
    import numpy as np

    array = np.ascontiguousarray(array)
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    if dtype.str not in ARRAY_DTYPES:
        raise LocalProtocolError("array", f"dtype {array.dtype} not allowed on the wire")
    array = array.astype(dtype, copy=False)
    data = RawBytes(memoryview(array).cast("B")) if array.nbytes >= RawBytes.BYTES_MIN else array.tobytes()
    return {"dtype": dtype.str, "shape": list(array.shape), "data": data}


def v_array(max_elements: int, dtypes: frozenset[str] = ARRAY_DTYPES) -> Validator:
    """Validates and decodes to a numpy array, zero copy over the frame's bytes (read-only for
    arrays inside msgpack; a writable view of the decrypted frame for those sent after it)."""
    fields = v_map({"dtype": v_str(8, dtypes & ARRAY_DTYPES), "shape": v_list(v_int(0, max_elements), ARRAY_DIMS_MAX),
                    "data": _v_buffer})

    def check(value: Any, where: str) -> Any:
        import numpy as np

        raw = fields(value, where)
        count = math.prod(raw["shape"])
        dtype = np.dtype(raw["dtype"])
        if count > max_elements:
            raise _bad(where, f"{count} elements exceed the limit {max_elements}")
        if len(raw["data"]) != count * dtype.itemsize:
            raise _bad(where, "data length does not match dtype and shape")
        array = np.frombuffer(raw["data"], dtype=dtype).reshape(raw["shape"])
        if dtype.kind == "f" and not np.isfinite(array).all():
            raise _bad(where, "non-finite values")
        return array
    return check
