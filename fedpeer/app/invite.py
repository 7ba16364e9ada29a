"""Invites: a site's name, advertised address, public key and fingerprint in one line that an
operator copies and pastes (`fedpeer invite` prints it, `fedpeer peer add --invite` reads it).

    fedpeer-invite:v1:<base64url, unpadded, of {"name", "address", "public_key", "fingerprint"} as JSON>

The version names the format: a reader refuses another version rather than guess. The fingerprint
is checked against the key when the line is read, so a line cut short or changed by hand is
refused. It proves nothing about who sent the line: whoever can change the line can change both.
An invite carries the public key that admits its holder to the federation, so it must reach the
other sites over a channel their operators trust (as a bare key had to), or its fingerprint be
confirmed over one (a phone call reading it out).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from fedpeer.config.load import name_problem, parse_address
from fedpeer.identity import encode_public_key, fingerprint, parse_public_key

PREFIX = "fedpeer-invite:"
VERSION = "v1"
INVITE_CHARS_MAX = 2048          # a v1 line is ~250 characters: anything much longer is not one
NAME_CHARS_MAX = 200
FIELDS = ("name", "address", "public_key", "fingerprint")


@dataclass(frozen=True)
class Invite:
    name: str
    address: str          # host:port, as the site advertises it
    public_key: str       # standard base64, as peers.toml holds it
    fingerprint: str

    @property
    def key(self) -> bytes:
        return parse_public_key(self.public_key)


def make(name: str, address: str, public_key: bytes) -> str:
    doc = {"name": name, "address": address, "public_key": encode_public_key(public_key),
           "fingerprint": fingerprint(public_key)}
    body = base64.urlsafe_b64encode(json.dumps(doc, separators=(",", ":")).encode("utf-8")).rstrip(b"=")
    return f"{PREFIX}{VERSION}:{body.decode('ascii')}"


def parse(text: str) -> Invite:
    """The invite in `text` (surrounding blanks and quotes ignored). ValueError, one line, naming
    what is wrong with it."""
    text = text.strip().strip("'\"").strip()
    if not text.startswith(PREFIX):
        raise ValueError(f"not an invite: it must start with {PREFIX!r} (copy the whole line 'fedpeer invite' "
                         "printed)")
    if len(text) > INVITE_CHARS_MAX:
        raise ValueError(f"not an invite: {len(text)} characters, more than {INVITE_CHARS_MAX}")
    version, sep, body = text[len(PREFIX):].partition(":")
    if not sep:
        raise ValueError("not an invite: no version (expected 'fedpeer-invite:v1:...')")
    if version != VERSION:
        raise ValueError(f"an invite of version {version!r}, and this fedpeer reads {VERSION!r} only: "
                         "install the same fedpeer version at both sites")
    try:
        doc = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (binascii.Error, ValueError):
        raise ValueError("the invite is damaged (its text does not decode): copy the whole line again") from None
    if not isinstance(doc, dict) or sorted(doc) != sorted(FIELDS) or not all(isinstance(doc[f], str) for f in FIELDS):
        raise ValueError(f"the invite is damaged: expected the text fields {', '.join(FIELDS)}")
    invite = Invite(**{f: doc[f].strip() for f in FIELDS})
    if not invite.name or len(invite.name) > NAME_CHARS_MAX:
        raise ValueError(f"the invite's site name must be 1 to {NAME_CHARS_MAX} characters")
    if (problem := name_problem(invite.name)) is not None:
        raise ValueError(f"the invite's site name {problem}")
    try:
        parse_address(invite.address)
        key = invite.key
    except ValueError as exc:
        raise ValueError(f"the invite of {invite.name!r} is damaged: {exc}") from None
    if fingerprint(key) != invite.fingerprint:
        raise ValueError(f"the invite of {invite.name!r} says fingerprint {invite.fingerprint} but its key's is "
                         f"{fingerprint(key)}: the line was changed on its way; ask {invite.name!r} for it again")
    return invite
