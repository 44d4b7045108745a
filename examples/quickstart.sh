#!/usr/bin/env bash
# Set up this machine for refmount, mount the bundled example reference set three times
# and read it with netCDF-C's ncdump:
#   MOUNTPOINT           the raw view (chunks as stored: shuffle + zlib), for zarr, xarray
#                        and GDAL >= 3.11, which decode them themselves;
#   MOUNTPOINT-decoded   the decoded view (refmount --decode), for every reader, ncdump
#                        and GDAL before 3.11 included;
#   MOUNTPOINT-nc        the netCDF view (refmount --netcdf): the dataset as one netCDF
#                        classic file, air.nc, for every program that opens a .nc path.
#   bash examples/quickstart.sh [MOUNTPOINT]      (default /tmp/refmount-air)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
mountpoint="${1:-/tmp/refmount-air}"
decoded="$mountpoint-decoded"
nc="$mountpoint-nc"
bash "$repo/.ci/setup"
for dir in "$mountpoint" "$decoded" "$nc"; do
  mkdir -p "$dir"
  if grep -qs " $(realpath "$dir") " /proc/mounts; then
    fusermount3 -u "$dir"
  fi
done
"$repo/.venv/bin/refmount" "$repo/examples/air/refs.json" "$mountpoint"
"$repo/.venv/bin/refmount" --decode "$repo/examples/air/refs.json" "$decoded"
"$repo/.venv/bin/refmount" --netcdf --netcdf-name air "$repo/examples/air/refs.json" "$nc"
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
echo "and as one netCDF file on $nc: ncdump -h $nc/air.nc"
ncdump -h "$nc/air.nc"
echo
echo "Unmount with: fusermount3 -u $mountpoint; fusermount3 -u $decoded; fusermount3 -u $nc"
