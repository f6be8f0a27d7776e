#!/bin/sh
# Runs test_locale (its path is $1) under de_DE.UTF-8, compiled by localedef
# into a temporary LOCPATH from the locales package's sources
# (scripts/install-deps.sh installs it), so that no system locale is needed.
set -eu
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
localedef -i de_DE -f UTF-8 "$dir/de_DE.UTF-8" 2>"$dir/localedef.log" || {
  echo "test_locale.sh: localedef could not build de_DE.UTF-8:" >&2
  cat "$dir/localedef.log" >&2
  exit 1
}
LOCPATH=$dir LC_ALL=de_DE.UTF-8 "$1"
