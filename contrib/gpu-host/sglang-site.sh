#!/usr/bin/env bash
# SGLang 0.5.17 in a site directory of its own, layered before the LMCache release's site
# and the staged vLLM (README.md beside this file, "SGLang"):
#   sglang-site.sh install PARTDIR   -> joins PARTDIR/sglang.tar.xz.part-* (each checked
#                                       against PARTDIR/sglang.sha256), unpacks site/ and
#                                       installs wheels/ into /tmp/site-sglang; a part that
#                                       is missing or differs: exit 3, nothing installed
#   sglang-site.sh check             -> exit 0 where an install completed, else 3 (saying why)
# A lane runs SGLang with SHAREDKV_EXTRA_SITE=/tmp/site-sglang (lmcache-site.sh run puts it
# first); service-wave.sh's sglang_lane does that after `check`.
set -euo pipefail
SITE=${SHAREDKV_SGLANG_SITE:-/tmp/site-sglang}
MARK="$SITE/.complete"

cmd=${1:-}
case "$cmd" in
  install)
    parts=${2:?usage: $0 install PARTDIR}
    [ -f "$parts/sglang.sha256" ] || { echo "no $parts/sglang.sha256: nothing installed" >&2; exit 3; }
    if ! (cd "$parts" && sha256sum --quiet -c sglang.sha256) >&2; then
      echo "a part of $parts is missing or differs (a staging transfer did not land):" \
           "nothing installed" >&2
      exit 3
    fi
    rm -rf "$SITE"; mkdir -p "$SITE"
    work=$(mktemp -d)
    # shellcheck disable=SC2046
    cat $(cd "$parts" && awk '{print $2}' sglang.sha256 | sed "s|^|$parts/|") \
      | xz -dc | tar -xf - -C "$work"
    cp -a "$work/site/." "$SITE/"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$work"/wheels/*.whl
    rm -rf "$work"
    date +%s > "$MARK"
    echo "SGLang site complete: $SITE"
    ;;
  check)
    if [ -f "$MARK" ] && [ -f "$SITE/sglang/__init__.py" ]; then exit 0; fi
    echo "no complete SGLang site in $SITE (a staging part did not land, or install was not run)" >&2
    exit 3
    ;;
  *)
    echo "usage: $0 install PARTDIR | check" >&2
    exit 2
    ;;
esac
