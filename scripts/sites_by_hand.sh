#!/usr/bin/env bash
# Bring up N fedpeer sites by hand on one host, the way operators do it across several hosts,
# without the harness: for each site `fedpeer init` (identity key + commented peers.toml), then
# `fedpeer key show` for its public key, then `fedpeer peer add` at every site for every other
# site (the key exchange), and finally print the commands that start and watch each daemon.
# Nothing is started: run the printed commands yourself (one terminal per site).
#
# On several hosts an operator does the same steps, each on its own host: `init` there, send the
# public key and advertised address to the others over a channel they trust, `peer add` theirs.
#
# Usage: scripts/sites_by_hand.sh [--sites N] [--dir DIR] [--host HOST] [--base-port PORT]
#                                 [--data CSV --label COLUMN [--positive VALUE]] [--fedpeer CMD]
#   --sites N         number of sites (default 3); named site-1 ... site-N
#   --dir DIR         where the sites' directories go (default ./sites); site directories must not exist
#   --host HOST       address every site listens on and advertises (default 127.0.0.1)
#   --base-port PORT  site k listens on PORT + k - 1 (default 7400)
#   --data CSV        also split CSV into one share per site (scripts/split_csv.py) and name it in
#                     each site's [data] section (needs --label; builtin:sonar works too)
#   --label COLUMN    the label column of --data
#   --positive VALUE  the positive class of --data, for binary jobs
#   --fedpeer CMD     the fedpeer command (default: this clone's .venv/bin/fedpeer, else fedpeer)
#   -h, --help        print this text
# Exit codes: 0 sites written; 2 a usage error; otherwise the failing fedpeer command's code.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
fail() { echo "sites_by_hand.sh: $*" >&2; exit 2; }

repo=$(cd "$(dirname "$0")/.." && pwd)
sites=3 dir=sites host=127.0.0.1 base_port=7400 data="" label="" positive="" fedpeer=""
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --sites|--dir|--host|--base-port|--data|--label|--positive|--fedpeer)
            [ $# -ge 2 ] || fail "$1 needs a value"
            opt=${1#--}; printf -v "${opt//-/_}" '%s' "$2"; shift 2 ;;
        *) fail "unknown argument '$1' (see --help)" ;;
    esac
done
[[ "$sites" =~ ^[0-9]+$ ]] && [ "$sites" -ge 2 ] && [ "$sites" -le 100 ] || fail "--sites must be 2 to 100"
[[ "$base_port" =~ ^[0-9]+$ ]] && [ $((base_port + sites - 1)) -le 65535 ] || fail "--base-port out of range"
[ -z "$data" ] || [ -n "$label" ] || fail "--data needs --label"
# The values go into TOML strings: refuse the characters that would need escaping.
for v in "$label" "$positive"; do [[ "$v" != *[\"\\]* ]] || fail "quotes and backslashes are not supported in --label/--positive"; done
if [ -z "$fedpeer" ]; then
    if [ -x "$repo/.venv/bin/fedpeer" ]; then fedpeer="$repo/.venv/bin/fedpeer"; else fedpeer=fedpeer; fi
fi
python=python3; [ -x "$repo/.venv/bin/python" ] && python="$repo/.venv/bin/python"

run() { echo "+ $*" >&2; "$@"; }   # show every command as the operator would type it

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
width=${#sites}
names=() keys=() addresses=()
for ((k = 1; k <= sites; k++)); do
    names+=("$(printf "site-%0${width}d" "$k")")
    addresses+=("$host:$((base_port + k - 1))")
done

if [ -n "$data" ]; then
    run "$python" "$repo/scripts/split_csv.py" "$data" --label "$label" --sites "$sites" --out-dir "$dir/shares" >/dev/null
fi

for ((k = 0; k < sites; k++)); do
    site_dir="$dir/${names[k]}"
    run "$fedpeer" init --dir "$site_dir" --name "${names[k]}" --listen "${addresses[k]}" >/dev/null
    if [ -n "$data" ]; then
        # [data] before any [[peer]] table; `peer add` appends the peers after it and checks the file.
        cp "$dir/shares/part-$((k + 1)).csv" "$site_dir/data.csv"
        { printf '\n[data]\ncsv = "data.csv"\nlabel = "%s"\n' "$label"
          [ -z "$positive" ] || printf 'positive = "%s"\n' "$positive"; } >> "$site_dir/peers.toml"
    fi
    shown=$(run "$fedpeer" key show --config "$site_dir/peers.toml")
    keys+=("${shown%%$'\n'*}")   # first line: the public key; second: its fingerprint
done

# The key exchange: every site pins every other site's key.
for ((k = 0; k < sites; k++)); do
    for ((j = 0; j < sites; j++)); do
        [ "$j" -ne "$k" ] || continue
        run "$fedpeer" peer add --config "$dir/${names[k]}/peers.toml" --name "${names[j]}" \
            --address "${addresses[j]}" --public-key "${keys[j]}" >/dev/null
    done
done

echo "Created $sites sites in $dir, each listing the others with their public keys."
echo "Start each site (one terminal each; logs go to stderr):"
for name in "${names[@]}"; do echo "  $fedpeer start --config $dir/$name/peers.toml"; done
echo "Then watch the federation from any site:"
echo "  $fedpeer status --config $dir/${names[0]}/peers.toml"
[ -z "$data" ] || echo "  $fedpeer run stats --config $dir/${names[0]}/peers.toml --wait"
