#!/usr/bin/env bash
# A real redis-server on the offline GPU host, for the L2 checks (two LMCache servers sharing
# KV through Redis), from Debian 12's packages:
#   redis-site.sh stage OUT           here (apt, network): the .debs into OUT/redis
#   redis-site.sh install DEBDIR [DEST]  there: unpacked into DEST (default /tmp/redis-site),
#                                     DEST/bin/redis-server runs it with the carried libraries
# `lmcache-site.sh run` puts DEST/bin on PATH, where the suite looks for redis-server.
# Debian's /usr/bin/redis-server (package redis-server) is a link to redis-check-rdb (package
# redis-tools), which links liblzf1, libjemalloc2, libssl3, libsystemd0 and libatomic1 and
# needs glibc 2.34 (`apt-cache depends redis-tools`, `ldd`); the GPU image (Ubuntu 22.04 or
# later) has libssl3, libsystemd0 and libatomic1, so liblzf1 and libjemalloc2 travel too.
set -euo pipefail
PACKAGES=(redis-server redis-tools liblzf1 libjemalloc2)

usage() { echo "usage: $0 stage OUT | install DEBDIR [DEST]" >&2; exit 2; }

case "${1:-}" in
  stage)
    [ $# -eq 2 ] || usage
    mkdir -p "$2/redis"
    (cd "$2/redis" && apt-get download "${PACKAGES[@]}")
    for package in "${PACKAGES[@]}"; do
      compgen -G "$2/redis/${package}_*.deb" > /dev/null \
        || { echo "$package: no .deb staged in $2/redis" >&2; exit 1; }
    done
    ;;
  install)
    [ $# -ge 2 ] && [ $# -le 3 ] || usage
    debs=$2; dest=${3:-/tmp/redis-site}
    for package in "${PACKAGES[@]}"; do
      compgen -G "$debs/${package}_*.deb" > /dev/null \
        || { echo "$package: no .deb in $debs (redis-site.sh stage)" >&2; exit 1; }
    done
    mkdir -p "$dest/bin" && dest=$(cd "$dest" && pwd)
    for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$dest"; done
    cat > "$dest/bin/redis-server" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="$dest/usr/lib/x86_64-linux-gnu:$dest/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" \\
  exec "$dest/usr/bin/redis-server" "\$@"
EOF
    chmod 755 "$dest/bin/redis-server"
    if ! version=$("$dest/bin/redis-server" --version 2>&1); then
      echo "the unpacked redis-server does not run here:" >&2
      echo "$version" >&2
      exit 1
    fi
    echo "$version"
    echo "redis-server: $dest/bin/redis-server (lmcache-site.sh run puts $dest/bin on PATH)"
    ;;
  *)
    usage
    ;;
esac
