#!/usr/bin/env bash
# Build HAMi's scheduler (its cmd/scheduler: the extender, the webhook) from a checkout of
# github.com/Project-HAMi/HAMi that the user provides, for `scripts/bench-cluster --peer
# hami=BINARY`. Nothing of HAMi is shipped or committed here: the checkout is yours, the
# binary lands in OUT (default: a new temporary directory).
#
#   scripts/build-hami-scheduler.sh CHECKOUT [OUT]
#
# Prints the checkout's commit, the build's time and the binary's path (last line). The
# scheduler needs cgo: its import graph holds github.com/NVIDIA/go-nvml/pkg/nvml (through
# pkg/device/nvidia), which does not compile with CGO_ENABLED=0 ("undefined: Return"). It
# needs no NVML on the build machine: go-nvml carries its own nvml.h and opens
# libnvidia-ml.so with dlopen at run time, which the scheduler never does. So: a C compiler
# (cc) and CGO_ENABLED=1, no tags. Go module dependencies come from GOPROXY.
# GO picks the go command (default: go on PATH, else /usr/local/go/bin/go).
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: $0 CHECKOUT [OUT]" >&2
    exit 2
fi
checkout="$(cd "$1" 2>/dev/null && pwd)" || { echo "$0: no directory $1" >&2; exit 2; }
if [[ ! -f "$checkout/go.mod" || ! -d "$checkout/cmd/scheduler" ]]; then
    echo "$0: $checkout is not a checkout of HAMi (no go.mod and cmd/scheduler)" >&2
    exit 2
fi
out="${2:-$(mktemp -d -t hami-scheduler-XXXXXX)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
command -v "${CC:-cc}" >/dev/null || { echo "$0: no C compiler (cc): HAMi's scheduler needs cgo" >&2; exit 2; }

commit="$(git -C "$checkout" rev-parse HEAD 2>/dev/null || echo unknown)"
describe="$(git -C "$checkout" describe --tags --always 2>/dev/null || echo unknown)"
echo "HAMi checkout $checkout at $commit ($describe)"

started=$(date +%s)
(cd "$checkout" && CGO_ENABLED=1 "$GO" build -trimpath -o "$out/scheduler" ./cmd/scheduler)
echo "built in $(( $(date +%s) - started )) s with $("$GO" version)"

# Once, to see that it runs: HAMi's scheduler prints its flags (cobra) and exits.
if ! "$out/scheduler" --help >"$out/scheduler.help" 2>&1; then
    echo "$0: $out/scheduler --help failed:" >&2
    cat "$out/scheduler.help" >&2
    exit 1
fi
grep -q -- '--http_bind' "$out/scheduler.help" || {
    echo "$0: $out/scheduler --help does not list --http_bind: not HAMi's scheduler?" >&2
    exit 1
}
echo "$out/scheduler"
