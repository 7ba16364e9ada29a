"""Vote signatures for tests whose member ids are not Ed25519 keys (fedpeer/core/election/raft.py takes
`sign` and `verify` as arguments).

Each member's "signature" is a keyed BLAKE2b of the statement under a secret drawn from the seed,
held in this table; `signer(member)` hands out that member's signing function and `verify` looks
the secret up. A simulated Byzantine member is given only its own signer, so, as with real keys, it
cannot produce another member's signature: it can only make up bytes or replay signatures it saw.
`verifications` counts verify calls, so a test can show a certificate is checked once, not per
heartbeat.
"""

from __future__ import annotations

import hashlib
import hmac
import random
from collections.abc import Callable, Iterable

SIGNATURE_BYTES = 64


class FakeKeyring:
    def __init__(self, members: Iterable[bytes], seed: object = 0) -> None:
        rng = random.Random(f"fake-keyring-{seed}")
        self._secrets = {m: rng.randbytes(32) for m in members}
        self.verifications = 0

    def signer(self, member: bytes) -> Callable[[bytes], bytes]:
        secret = self._secrets[member]
        return lambda statement: hashlib.blake2b(statement, key=secret, digest_size=SIGNATURE_BYTES).digest()

    def verify(self, voter: bytes, statement: bytes, signature: bytes) -> bool:
        self.verifications += 1
        secret = self._secrets.get(voter)
        if secret is None:
            return False
        want = hashlib.blake2b(statement, key=secret, digest_size=SIGNATURE_BYTES).digest()
        return hmac.compare_digest(want, signature)
