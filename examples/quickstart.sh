#!/usr/bin/env bash
# Set up this machine for refmount and mount the bundled example reference set.
#   bash examples/quickstart.sh [MOUNTPOINT]      (default /tmp/refmount-air)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
mountpoint="${1:-/tmp/refmount-air}"
bash "$repo/.ci/setup"
mkdir -p "$mountpoint"
if grep -qs " $(realpath "$mountpoint") " /proc/mounts; then
  fusermount3 -u "$mountpoint"
fi
"$repo/.venv/bin/refmount" "$repo/examples/air/refs.json" "$mountpoint"
echo "Mounted examples/air/refs.json on $mountpoint:"
ls -lAR "$mountpoint"
echo
echo "Unmount with: fusermount3 -u $mountpoint"
