#!/usr/bin/env bash
# Builds the Debian package (binary only, unsigned) into OUTDIR:
#   tools/deb.sh OUTDIR      # -> OUTDIR/sluice_VERSION_ARCH.deb, .changes, .buildinfo
# then: apt install ./OUTDIR/sluice_*.deb && systemctl start sluice
#
# The build runs in a copy of the source tree (the files git knows, as they
# are now, plus new ones not ignored), so neither the tree nor its parent
# directory gets build products. Needs the packages in debian/control's
# Build-Depends (tools/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -eq 1 ]] || { echo "usage: tools/deb.sh OUTDIR" >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
src=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/sluice"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$src" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done |
    tar -C "$src" --null -T - -cf - | tar -C "$work/sluice" -xf -
else
  tar -C "$src" --exclude='./build*' --exclude=./.git -cf - . | tar -C "$work/sluice" -xf -
fi
# ccache (when meson finds it) keys on paths: relative to the copy, builds
# from different copies share their results.
export CCACHE_BASEDIR="$work/sluice"
if command -v ccache >/dev/null; then
  CCACHE_DIR=$(ccache -k cache_dir)
  export CCACHE_DIR
fi
# dpkg-buildpackage writes the packages beside the source directory.
(cd "$work/sluice" && dpkg-buildpackage -us -uc -b -j"${DEB_JOBS:-2}") >"$work/build.log" 2>&1 || {
  tail -n 80 "$work/build.log" >&2
  echo "deb: dpkg-buildpackage failed (log above)" >&2
  exit 1
}
shopt -s nullglob
built=("$work"/*.deb "$work"/*.changes "$work"/*.buildinfo)
[[ ${#built[@]} -gt 0 ]] || { echo "deb: no package was built" >&2; exit 1; }
cp "${built[@]}" "$out/"
for f in "${built[@]}"; do echo "$out/$(basename "$f")"; done
