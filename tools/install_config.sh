#!/bin/sh
# meson install script: puts the example configuration at DIR/sluice.toml
# unless a file is already there, so reinstalling never overwrites an
# operator's configuration. Usage: install_config.sh SOURCE DIR
set -eu
src=$1
dir=${DESTDIR:-}$2
if [ -e "$dir/sluice.toml" ]; then
  echo "Keeping $dir/sluice.toml (not replaced by the example)"
  exit 0
fi
install -d "$dir"
install -m 0644 "$src" "$dir/sluice.toml"
echo "Installing $src to $dir/sluice.toml"
