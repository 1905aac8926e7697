#!/usr/bin/env bash
# Prints, one a line, the Debian/Ubuntu packages that hold the shared
# libraries the given binaries load (ldd), so that the runtime image installs
# exactly those. Run where the binaries were built (the Dockerfile's build
# stage). Libraries of the NVIDIA driver (libcuda, libnvidia-*) are left out:
# the NVIDIA Container Toolkit mounts them from the host. A library that no
# package owns is an error.
#
#   deploy/docker/runtime-packages.sh build/server/klserve build/client/klctl
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 BINARY..." >&2; exit 2; }

owner() {  # owner FILE: the package owning FILE, trying the usrmerge aliases
  local f="$1" real candidates=() c out
  real="$(readlink -f "$f")"
  candidates=("$f" "$real")
  for c in "$f" "$real"; do
    case "$c" in
      /usr/lib/*) candidates+=("${c#/usr}") ;;
      /lib/*) candidates+=("/usr$c") ;;
    esac
  done
  for c in "${candidates[@]}"; do
    if out="$(dpkg-query -S "$c" 2>/dev/null)"; then
      # "pkg:arch: /path" (or "pkg1, pkg2: /path" for a diverted file).
      echo "${out%%: *}" | tr ',' '\n' | sed 's/^ *//; s/:.*$//' | head -n1
      return 0
    fi
  done
  return 1
}

status=0
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
{
  for bin in "$@"; do
    [[ -f "$bin" ]] || { echo "runtime-packages.sh: no $bin" >&2; echo "!missing"; continue; }
    ldd "$bin" | while read -r name arrow path _; do
      case "$name" in
        linux-vdso.so.*|/lib*/ld-linux*|libcuda.so*|libnvidia-*) continue ;;
      esac
      if [[ "$arrow" != "=>" || "$path" == "not" ]]; then
        echo "runtime-packages.sh: $bin: $name not found" >&2
        echo "!missing"
        continue
      fi
      if ! owner "$path"; then
        echo "runtime-packages.sh: no package owns $path" >&2
        echo "!missing"
      fi
    done
  done
} | sort -u > "$tmp"
if grep -q '^!missing$' "$tmp"; then status=1; fi
grep -v '^!missing$' "$tmp" || true
exit "$status"
