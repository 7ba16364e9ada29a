"""A site's identity: one Ed25519 key pair.

- The key file holds the 32-byte Ed25519 seed, base64, under a comment line; mode 0600; never
  overwritten.
- Public keys travel as standard base64 (44 characters). A fingerprint is the first 8 bytes of
  SHA-256(public key) in hex, for logs and humans.
- Signatures: Ed25519 over `SIGN_DOMAIN + message`, so a fedpeer signature can never be replayed
  as a signature of anything else.
- The pair's static agreement: X25519 keys derived from the Ed25519 identities (one key pair per
  site is enough) give each pair of sites secrets only they can compute (`pairwise_seed`): the
  hello's tag and the session seed (fedpeer/wire/session.py), refusal tags, pairwise secure-sum masks.
  Messages themselves are sealed under sessions (fedpeer/wire/session.py, fedpeer/wire/frame.py).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import os
from pathlib import Path

import nacl.bindings
import nacl.exceptions
import nacl.signing

from fedpeer.base.files import check_key_file_mode
from fedpeer.errors import ConfigError

PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
SIGN_DOMAIN = b"fedpeer/v1\x00"
_KEY_HEADER = "# fedpeer identity key (Ed25519 seed, base64). Secret: keep mode 0600, never share.\n"


def encode_public_key(key: bytes) -> str:
    return base64.b64encode(key).decode("ascii")


def parse_public_key(text: str) -> bytes:
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not valid base64") from None
    if len(key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"expected {PUBLIC_KEY_BYTES} bytes, got {len(key)}")
    return key


def fingerprint(key: bytes) -> str:
    digest = hashlib.sha256(key).hexdigest()[:16]
    return "-".join(digest[i:i + 4] for i in range(0, 16, 4))


class Identity:
    """This site's key pair: signing, and the static agreement with each peer."""

    def __init__(self, seed: bytes) -> None:
        assert len(seed) == 32
        self._signing = nacl.signing.SigningKey(seed)
        self.public_key: bytes = bytes(self._signing.verify_key)
        self._box_private = bytes(self._signing.to_curve25519_private_key())
        self._shared: dict[bytes, bytes] = {}

    @classmethod
    def generate(cls) -> Identity:
        return cls(os.urandom(32))

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self._signing.sign(SIGN_DOMAIN + message).signature

    def _shared_key(self, peer: bytes) -> bytes:
        """crypto_box's precomputed key for `peer` (X25519 + HSalsa20), cached per peer: the
        cache is bounded by the allowlist, since only allow-listed keys get this far."""
        key = self._shared.get(peer)
        if key is None:
            peer_curve = nacl.bindings.crypto_sign_ed25519_pk_to_curve25519(peer)
            key = self._shared[peer] = nacl.bindings.crypto_box_beforenm(peer_curve, self._box_private)
        return key

    def pairwise_seed(self, peer: bytes, label: bytes) -> bytes:
        """32 secret bytes that only this site and `peer` can compute (both sides get the same):
        keyed BLAKE2b of `label` under the pair's X25519 shared key, with its own personalisation
        so the seed is independent of any other use of that key. Used for the hello's tag and the
        session seed (fedpeer/wire/session.py), refusal tags and pairwise secure-sum masks."""
        return hashlib.blake2b(label, key=self._shared_key(peer), digest_size=32,
                               person=b"fedpeer-pairwise").digest()


@functools.lru_cache(maxsize=1024)
def _verify_key(public_key: bytes) -> nacl.signing.VerifyKey:
    return nacl.signing.VerifyKey(public_key)


def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    try:
        _verify_key(public_key).verify(SIGN_DOMAIN + message, signature)
        return True
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, nacl.exceptions.TypeError):
        return False


def create_key_file(path: Path, seed: bytes | None = None) -> Identity:
    """Create a new identity at `path` (mode 0600). Refuses to overwrite an existing file. `seed`
    (32 bytes): this very key — only for a local demo federation that must be reproducible
    (fedpeer/app/harness/federation.py); a site's key is always fresh randomness."""
    identity = Identity(seed) if seed is not None else Identity.generate()
    seed = bytes(identity._signing)
    text = _KEY_HEADER + base64.b64encode(seed).decode("ascii") + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:   # O_EXCL: never overwrite a key, even in a race with another `fedpeer init`
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(path, "", "key file already exists; refusing to overwrite an identity") from None
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return identity


def load_key_file(path: Path, config_path: Path | None = None) -> Identity:
    check_key_file_mode(path, config_path=config_path)
    where = config_path or path
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="ascii").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(where, "node.key_file", f"cannot read key file {path}: {exc}") from None
    body = [ln for ln in lines if ln and not ln.startswith("#")]
    try:
        if len(body) != 1:
            raise ValueError
        seed = base64.b64decode(body[0], validate=True)
        if len(seed) != 32:
            raise ValueError
    except (ValueError, binascii.Error):
        raise ConfigError(where, "node.key_file", f"key file {path} is not a fedpeer identity key") from None
    return Identity(seed)
