#!/usr/bin/env bash
# Builds HAMi-WebUI's backend ("server", Go module `vgpu`) from its source, for the manual
# check scripts/check-hami-webui (docs/scheduler.md, "HAMi-WebUI and the node annotation").
# CI cannot run it: the source and two of its code generators are not served by the Go
# module proxy, only by a fetched copy of their repositories.
#
# Inputs (bare git copies of the two repositories):
#   WEBUI_GIT   Project-HAMi/HAMi-WebUI  (default /work/.mirror/Project-HAMi+HAMi-WebUI/repo)
#   WEBUI_REF   commit/ref to build      (default HEAD; tested: 8f42445, "Merge PR #101")
#   KRATOS_GIT  go-kratos/kratos         (default /work/.mirror/go-kratos+kratos/repo)
#   KRATOS_REF  kratos tag for the protoc plugins (default v2.7.3, the version server/go.mod requires)
#   WORK        scratch folder (default /tmp/hami-webui/build); OUT_BIN output binary
#               (default /tmp/hami-webui/hami-webui-server)
#   GO          go command (default: go on PATH, else /usr/local/go/bin/go); tested with go1.26.8
#
# Why from source: the repo commits no generated code (no *.pb.go, *_http.pb.go,
# *_errors.pb.go, wire_gen.go). `make generate` runs `kratos proto client .`, which needs
# protoc-gen-go-http and protoc-gen-go-errors; the Go module proxy answers 403 for
# github.com/go-kratos/kratos/cmd/protoc-gen-go-{http,errors}/v2, so they are built here
# from kratos's own source at the tag (each has its own go.mod; its deps come from the proxy).
# google/wire's wire@v0.6.0 (server/go.mod's) does not compile with Go 1.26 (old x/tools),
# so the generator is wire@v0.7.0; the generated wire_gen.go only imports the runtime
# package github.com/google/wire, which stays at v0.6.0 from go.mod.
#
# Versions: protoc (Debian protobuf-compiler) 3.21.12; protoc-gen-go v1.34.2 (= go.mod's
# google.golang.org/protobuf); protoc-gen-go-grpc v1.4.0 (matches grpc v1.64 API);
# protoc-gen-go-http / protoc-gen-go-errors from kratos v2.7.3; wire v0.7.0.
set -euo pipefail

WEBUI_GIT="${WEBUI_GIT:-/work/.mirror/Project-HAMi+HAMi-WebUI/repo}"
WEBUI_REF="${WEBUI_REF:-HEAD}"
KRATOS_GIT="${KRATOS_GIT:-/work/.mirror/go-kratos+kratos/repo}"
KRATOS_REF="${KRATOS_REF:-v2.7.3}"
WORK="${WORK:-/tmp/hami-webui/build}"
OUT_BIN="${OUT_BIN:-/tmp/hami-webui/hami-webui-server}"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

log() { printf '%s build-webui: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
start=${SECONDS}

command -v protoc >/dev/null || {
  log "installing protobuf-compiler (Debian)"
  apt-get install -y -qq protobuf-compiler >/dev/null || { apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null; }
}
log "protoc: $(protoc --version)"

rm -rf "${WORK}"
mkdir -p "${WORK}/src" "${WORK}/kratos" "${WORK}/bin" "$(dirname "${OUT_BIN}")"
export GOBIN="${WORK}/bin"
export PATH="${GOBIN}:${PATH}"
export CGO_ENABLED=0
export GOFLAGS="-trimpath -mod=mod"

# 1. Sources.
git -C "${WEBUI_GIT}" archive "${WEBUI_REF}" server | tar -x -C "${WORK}/src"
git -C "${KRATOS_GIT}" archive "${KRATOS_REF}" cmd/protoc-gen-go-http cmd/protoc-gen-go-errors \
  | tar -x -C "${WORK}/kratos"
log "sources: HAMi-WebUI $(git -C "${WEBUI_GIT}" rev-parse --short "${WEBUI_REF}"), kratos ${KRATOS_REF}"

# 2. Code generators.
t0=${SECONDS}
"${GO}" install google.golang.org/protobuf/cmd/protoc-gen-go@v1.34.2
"${GO}" install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.4.0
"${GO}" install github.com/google/wire/cmd/wire@v0.7.0
for p in http errors; do
  (cd "${WORK}/kratos/cmd/protoc-gen-go-${p}" && "${GO}" install .)
done
log "generators built in $((SECONDS - t0)) s"

# 3. protoc, as `kratos proto client .` would run it (minus --openapi_out: openapi.yaml is committed).
cd "${WORK}/src/server"
for f in api/v1/*.proto; do
  protoc --proto_path=. --proto_path=third_party \
    --go_out=paths=source_relative:. --go-grpc_out=paths=source_relative:. \
    --go-http_out=paths=source_relative:. --go-errors_out=paths=source_relative:. "${f}"
done
protoc --proto_path=. --proto_path=third_party --go_out=paths=source_relative:. internal/conf/conf.proto

# 4. wire, then build.
t0=${SECONDS}
"${GO}" mod download
(cd cmd/server && wire .)
log "modules + wire in $((SECONDS - t0)) s"
t0=${SECONDS}
"${GO}" build -p "$(( $(nproc) > 4 ? 4 : $(nproc) ))" -ldflags="-s -w -X main.Name=hami-webui-server" \
  -o "${OUT_BIN}" ./cmd/server
log "server built in $((SECONDS - t0)) s; total $((SECONDS - start)) s"
ls -l "${OUT_BIN}" >&2
echo "${OUT_BIN}"
