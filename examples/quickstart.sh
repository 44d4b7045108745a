#!/usr/bin/env bash
# Set up this machine for refmount, mount the bundled example reference set twice and read
# it with netCDF-C's ncdump:
#   MOUNTPOINT           the raw view (chunks as stored: shuffle + zlib), for zarr, xarray
#                        and GDAL >= 3.11, which decode them themselves;
#   MOUNTPOINT-decoded   the decoded view (refmount --decode), for every reader, ncdump
#                        and GDAL before 3.11 included.
#   bash examples/quickstart.sh [MOUNTPOINT]      (default /tmp/refmount-air)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
mountpoint="${1:-/tmp/refmount-air}"
decoded="$mountpoint-decoded"
bash "$repo/.ci/setup"
for dir in "$mountpoint" "$decoded"; do
  mkdir -p "$dir"
  if grep -qs " $(realpath "$dir") " /proc/mounts; then
    fusermount3 -u "$dir"
  fi
done
"$repo/.venv/bin/refmount" "$repo/examples/air/refs.json" "$mountpoint"
"$repo/.venv/bin/refmount" --decode "$repo/examples/air/refs.json" "$decoded"
echo "Mounted examples/air/refs.json on $mountpoint:"
ls -lAR "$mountpoint"
echo
echo "and decoded on $decoded (each chunk its array bytes: 31*25*53*4 = 164300 bytes):"
ls -l "$decoded/air"
echo
echo "ncdump -v air 'file://$decoded#mode=zarr,file' (the first lines of air's values):"
air_decoded="$(ncdump -v air "file://$decoded#mode=zarr,file" | sed -n '/^ air =/,$p')"
awk 'NR <= 4' <<<"$air_decoded"
# The same variable read from the original netCDF4 file by the same ncdump.
air_original="$(ncdump -v air "$repo/examples/air/air.nc" | sed -n '/^ air =/,$p')"
if [ "$air_decoded" = "$air_original" ]; then
  count=$(tr -cs '0-9.e+-' '\n' <<<"$air_decoded" | grep -c '[0-9]')
  echo "All $count values of air equal ncdump's reading of examples/air/air.nc."
else
  echo "ncdump of the decoded mount differs from ncdump of examples/air/air.nc" >&2
  exit 1
fi
echo
echo "Unmount with: fusermount3 -u $mountpoint; fusermount3 -u $decoded"
