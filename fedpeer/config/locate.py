"""Which peers.toml a command means, and where a running daemon said it can be reached.

Every command that reads a site's configuration takes `--config FILE`; without it, `find` looks,
in order, at `$FEDPEER_CONFIG`, `./peers.toml` and `/etc/fedpeer/peers.toml`. A file named
explicitly (by `--config` or the variable) is used even if it does not exist, so that the error
names it; the two default places are used only if they exist.

The daemon writes `<state_dir>/running.json` (its configuration file, admin endpoint, when it
loaded the configuration, its pid) at start and after every reload it accepted. `fedpeer status`
reads it when peers.toml no longer loads (an edit that broke it): the daemon still runs the
configuration it loaded before, and still answers on that admin endpoint. The state directory is
then taken from the broken file as far as it can be read (`last_good`).
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from fedpeer.errors import ConfigError

CONFIG_ENV = "FEDPEER_CONFIG"
DEFAULT_PLACES = (Path("peers.toml"), Path("/etc/fedpeer/peers.toml"))
PLACES_TEXT = f"--config FILE, ${CONFIG_ENV}, ./peers.toml or /etc/fedpeer/peers.toml"
RUNNING_FILE = "running.json"            # in state_dir
DEFAULT_STATE_DIR = "state"              # [node] state_dir when the file does not set it (config/load.py)
RUNNING_FILE_BYTES_MAX = 64 * 1024       # a record is ~300 bytes: anything larger is not ours
_STATE_DIR_LINE = re.compile(r'^\s*state_dir\s*=\s*"([^"\n]+)"', re.MULTILINE)


def find(given: Path | None, environ: dict[str, str] | None = None, cwd: Path | None = None) -> Path:
    """The peers.toml a command reads: `given`, else $FEDPEER_CONFIG, else the first default place
    that exists. ConfigError (exit 2) naming the places when there is none."""
    if given is not None:
        return given
    env = (os.environ if environ is None else environ).get(CONFIG_ENV, "").strip()
    if env:
        return Path(env)
    for place in DEFAULT_PLACES:
        path = place if place.is_absolute() or cwd is None else cwd / place
        if path.is_file():
            return path
    raise ConfigError("peers.toml", "", f"no configuration given or found; name it with {PLACES_TEXT}")


@dataclass(frozen=True)
class Running:
    """What a running daemon recorded of itself (`<state_dir>/running.json`)."""

    config_path: Path
    admin: str          # "unix:/abs/path" or "127.0.0.1:PORT", as config/load.py resolved it
    state_dir: Path     # holds admin.token for a TCP admin endpoint
    loaded_at: str      # when it loaded the configuration it runs (ISO 8601, UTC)
    pid: int

    @property
    def admin_socket(self) -> Path | None:
        return Path(self.admin[5:]) if self.admin.startswith("unix:") else None


def write_running(config_path: Path, admin: str, state_dir: Path, loaded_at: str) -> None:
    """Record the configuration the daemon now runs (at start and after an accepted reload).
    Raises OSError (the caller logs it: the record only helps `status` past a broken file)."""
    from fedpeer.base.store import atomic_write   # here: `status` imports this module, and store imports logs

    doc = {"config": str(config_path), "admin": admin, "state_dir": str(state_dir), "loaded_at": loaded_at,
           "pid": os.getpid()}
    atomic_write(state_dir / RUNNING_FILE, (json.dumps(doc, indent=1) + "\n").encode("utf-8"), mode=0o600)


def last_good(config_path: Path) -> Running | None:
    """The record of the daemon that runs `config_path`, or None. Its state directory is read from
    the file as far as it parses: the TOML's [node] state_dir, else a `state_dir = "..."` line,
    else the default next to the file."""
    config_path = Path(config_path).resolve()
    state_dir = config_path.parent / _state_dir_text(config_path)
    try:
        with open(state_dir / RUNNING_FILE, "rb") as f:
            doc = json.loads(f.read(RUNNING_FILE_BYTES_MAX))
        running = Running(Path(doc["config"]), str(doc["admin"]), Path(doc["state_dir"]), str(doc["loaded_at"]),
                          int(doc["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return running if running.config_path == config_path else None


def _state_dir_text(config_path: Path) -> str:
    try:
        text = config_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return DEFAULT_STATE_DIR
    try:
        node = tomllib.loads(text).get("node")
        value = node.get("state_dir", DEFAULT_STATE_DIR) if isinstance(node, dict) else DEFAULT_STATE_DIR
        return value.strip() if isinstance(value, str) and value.strip() else DEFAULT_STATE_DIR
    except tomllib.TOMLDecodeError:
        match = _STATE_DIR_LINE.search(text)
        return match.group(1) if match else DEFAULT_STATE_DIR
