"""Files that hold a secret (the key file, a database password file): readable by their owner only;
and what decides who a site is and whom it trusts (peers.toml, the directories of the key and of
peers.toml, the state directory): writable by nobody else.

One check for each, at start and on every reload, so a daemon never runs for hours with a secret
that other local users can read, or a peers.toml, key or state another user could replace. Errors
are `ConfigError(path, key, problem)` naming the file, the peers.toml key that points at it and
the command that fixes it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fedpeer.errors import ConfigError


def check_key_file_mode(path: Path, key: str = "node.key_file", config_path: Path | None = None) -> None:
    """Refuse a key file that others than its owner can read (or that we cannot)."""
    check_private_file(path, key, config_path, "key file", "create it with 'fedpeer init'")


def check_private_file(path: Path, key: str, config_path: Path | None, noun: str, missing_fix: str) -> None:
    where = config_path or path
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigError(where, key, f"{noun} {path} does not exist ({missing_fix})") from None
    except OSError as exc:
        raise ConfigError(where, key, f"cannot read {noun} {path}: {exc}") from None
    if st.st_uid != os.geteuid():
        raise ConfigError(where, key, f"{noun} {path} belongs to another user (uid {st.st_uid}); it must be "
                          f"this user's own: run fedpeer as its owner, or: chown {os.geteuid()} {path}")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(where, key, f"{noun} {path} is readable by others "
                          f"(mode {stat.S_IMODE(st.st_mode):04o}); run: chmod 600 {path}")
    if not os.access(path, os.R_OK):
        raise ConfigError(where, key, f"{noun} {path} is not readable by this user")


def check_site_directory(directory: Path, config_path: Path) -> None:
    """Refuse a site directory (the one holding peers.toml) that others may write to: they could
    replace peers.toml or the key file, that is, the site's peers and identity."""
    check_not_writable_by_others(directory, config_path, "", "the site directory",
                                 "who could replace peers.toml or the key file")


def check_not_writable_by_others(path: Path, config_path: Path, key: str, noun: str, why: str) -> None:
    """Refuse `path` if a user other than this one (or root) can write it: its group or others have
    write permission, or it belongs to another user who is not root. A path that does not exist
    yet passes (the daemon makes it, its own). `why`: what such a user could do with it."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(config_path, key, f"cannot read {noun} {path}: {exc}") from None
    if st.st_uid not in (os.geteuid(), 0):
        raise ConfigError(config_path, key, f"{noun} {path} belongs to another user (uid {st.st_uid}), {why}; "
                          f"run fedpeer as its owner, or: chown {os.geteuid()} {path}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(config_path, key, f"{noun} {path} is writable by others (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}), {why}; run: chmod go-w {path}")
