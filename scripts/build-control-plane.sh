#!/usr/bin/env bash
# Builds the control plane the end-to-end suite runs: kube-apiserver,
# kube-scheduler, kube-controller-manager (for batch Jobs), kubelet and kubectl from the k8s.io/kubernetes Go module at a pinned
# release, fake-cri (tools/fake-cri: the fake CRI runtime of the same release's
# k8s.io/cri-client, which the kubelet runs against), and
# etcd built from go.etcd.io/etcd/server/v3 (v3.6, the series Kubernetes 1.36 is
# tested with). Debian's etcd-server (3.4.23 on Debian 12) is an option: the
# API server runs on it but reports "RequestWatchProgress feature is not
# supported" and its watch cache then logs "Too large resource version"
# timeouts. Binaries go to a cache outside the repository, keyed by the
# Kubernetes version; what is already there is not built again (remove the
# folder to rebuild), except fake-cri when its source changed. Helm
# (helm.sh/helm/v3) is built beside them: the suite renders the chart in
# charts/ with it. Kueue (sigs.k8s.io/kueue/cmd/kueue) is built beside them too, with
# the manifests it needs in kueue-manifests/: its CRDs (crd/bases), the patches that
# give them conversion webhooks (crd/patches) and its webhook configurations
# (webhook/manifests.yaml), as the module ships them; harness/kueue.py installs them.
#
#   scripts/build-control-plane.sh          # build (or reuse) and print the folder
#   scripts/build-control-plane.sh --print  # only print the folder
#
# Settings (environment):
#   PYHAMI_K8S_VERSION          Kubernetes release (default v1.36.3)
#   PYHAMI_ETCD_SOURCE          go (default): build etcd; debian: unpack Debian's etcd-server
#   PYHAMI_ETCD_VERSION         etcd release built from Go (default v3.6.16)
#   PYHAMI_HELM_VERSION         Helm release built from Go (default v3.22.0)
#   PYHAMI_KUEUE_VERSION        Kueue release built from Go (default v0.17.0)
#   PYHAMI_CONTROL_PLANE_CACHE  cache root (default ~/.cache/pyhami/control-plane)
#   GO                          the go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

K8S_VERSION="${PYHAMI_K8S_VERSION:-v1.36.3}"
ETCD_SOURCE="${PYHAMI_ETCD_SOURCE:-go}"
ETCD_VERSION="${PYHAMI_ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${PYHAMI_HELM_VERSION:-v3.22.0}"
KUEUE_VERSION="${PYHAMI_KUEUE_VERSION:-v0.17.0}"
CACHE_ROOT="${PYHAMI_CONTROL_PLANE_CACHE:-${HOME}/.cache/pyhami/control-plane}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${CACHE_ROOT}/${K8S_VERSION}"

if [[ "${1:-}" == "--print" ]]; then
  echo "${OUT}"
  exit 0
fi

log() { printf '%s build-control-plane: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

have() { [[ -x "${OUT}/$1" ]]; }

# fake-cri is built from this repository: rebuilt when tools/fake-cri/main.go changes
# (its sha256 is kept beside the binary).
FAKE_CRI_SOURCE="${REPO}/tools/fake-cri/main.go"
fake_cri_sum() { sha256sum "${FAKE_CRI_SOURCE}" | cut -d' ' -f1; }
fake_cri_current() {
  have fake-cri && [[ "$(cat "${OUT}/fake-cri.sha256" 2>/dev/null)" == "$(fake_cri_sum)" ]]
}

# Kueue is there when its binary, its manifests and the version they came from are.
have_kueue() {
  have kueue && [[ -d "${OUT}/kueue-manifests/crd/bases" \
    && -f "${OUT}/kueue-manifests/webhook/manifests.yaml" \
    && "$(cat "${OUT}/kueue.version" 2>/dev/null)" == "${KUEUE_VERSION}" ]]
}

# VERSIONS beside the binaries, one a line: the Kubernetes release, etcd's own
# version, Helm's, then Kueue's.
record_versions() {
  local etcd_version helm_version
  etcd_version="$("${OUT}/etcd" --version | sed -n 's/^etcd Version: *//p' | head -n1)"
  helm_version="$("${OUT}/helm" version --template '{{.Version}}')"
  printf '%s\nv%s\n%s\n%s\n' "${K8S_VERSION}" "${etcd_version}" "${helm_version}" \
    "$(cat "${OUT}/kueue.version")" >"${OUT}/VERSIONS"
}

mkdir -p "${OUT}"
K8S_COMMANDS=(kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl)
missing_k8s=()
for name in "${K8S_COMMANDS[@]}"; do
  have "${name}" || missing_k8s+=("${name}")
done
fake_cri_current || missing_k8s+=(fake-cri)

if (( ${#missing_k8s[@]} == 0 )) && have etcd && have helm && have_kueue; then
  log "all binaries present, nothing to build"
  [[ "$(wc -l <"${OUT}/VERSIONS" 2>/dev/null || echo 0)" -ge 4 ]] || record_versions
  echo "${OUT}"
  exit 0
fi

GO="${GO:-$(command -v go || true)}"
if [[ -z "${GO}" && -x /usr/local/go/bin/go ]]; then
  GO=/usr/local/go/bin/go
fi
if [[ -z "${GO}" ]]; then
  echo "build-control-plane: no go command found (set GO=/path/to/go)" >&2
  exit 1
fi

# Lean, reproducible binaries; one compile job per core (at most four).
export CGO_ENABLED=0
export GOFLAGS="-trimpath -mod=mod"
JOBS="${PYHAMI_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
(( JOBS > 4 )) && JOBS=4

WORK="$(mktemp -d "${TMPDIR:-/tmp}/pyhami-control-plane.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT

start_all=${SECONDS}

if (( ${#missing_k8s[@]} > 0 )); then
  log "downloading k8s.io/kubernetes@${K8S_VERSION}"
  t0=${SECONDS}
  k8s_dir="$("${GO}" mod download -json "k8s.io/kubernetes@${K8S_VERSION}" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  if [[ -z "${k8s_dir}" || ! -f "${k8s_dir}/go.mod" ]]; then
    echo "build-control-plane: k8s.io/kubernetes@${K8S_VERSION} not found in the module cache" >&2
    exit 1
  fi
  # The release requires its staging modules at v0.0.0 and replaces them with
  # ./staging/...; replace directives only apply in the main module, so the
  # throwaway module states its own: k8s.io/X => k8s.io/X v0.N.P.
  staging_version="v0.${K8S_VERSION#v1.}"
  mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' \
    "${k8s_dir}/go.mod" | sort -u)
  if (( ${#staging[@]} < 10 )); then
    echo "build-control-plane: found only ${#staging[@]} staging modules in ${k8s_dir}/go.mod" >&2
    exit 1
  fi
  go_line="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "${k8s_dir}/go.mod" | head -n1)"
  mkdir -p "${WORK}/k8s"
  {
    echo "module pyhami.invalid/control-plane"
    echo
    echo "go ${go_line:-1.25}"
    echo
    echo "require k8s.io/kubernetes ${K8S_VERSION}"
    echo
    echo "replace ("
    for m in "${staging[@]}"; do
      echo "	${m} => ${m} ${staging_version}"
    done
    echo ")"
  } >"${WORK}/k8s/go.mod"
  log "${#staging[@]} staging modules replaced at ${staging_version}"
  # fake-cri is built inside this module: its k8s.io/cri-client is the release's.
  mkdir -p "${WORK}/k8s/fake-cri"
  cp "${FAKE_CRI_SOURCE}" "${WORK}/k8s/fake-cri/main.go"
  get=()
  for name in "${K8S_COMMANDS[@]}"; do
    get+=("k8s.io/kubernetes/cmd/${name}@${K8S_VERSION}")
  done
  (cd "${WORK}/k8s" && "${GO}" mod download k8s.io/kubernetes \
    && "${GO}" get "${get[@]}" "k8s.io/cri-client@${staging_version}")
  log "modules resolved in $((SECONDS - t0)) s"

  t0=${SECONDS}
  minor="${K8S_VERSION#v1.}"
  minor="${minor%%.*}"
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X ${pkg}.gitVersion=${K8S_VERSION}"
    ldflags+=" -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
    ldflags+=" -X ${pkg}.gitTreeState=clean"
    ldflags+=" -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
  done
  # Only what is missing; each is timed (kubelet alone takes minutes on two cores).
  mkdir -p "${WORK}/bin"
  for name in "${missing_k8s[@]}"; do
    t1=${SECONDS}
    package="k8s.io/kubernetes/cmd/${name}"
    [[ "${name}" == fake-cri ]] && package=./fake-cri
    log "building ${name} (${JOBS} jobs)"
    (cd "${WORK}/k8s" && "${GO}" build -p "${JOBS}" -ldflags="${ldflags}" \
      -o "${WORK}/bin/${name}" "${package}")
    mv -f "${WORK}/bin/${name}" "${OUT}/"
    [[ "${name}" == fake-cri ]] && fake_cri_sum >"${OUT}/fake-cri.sha256"
    log "${name} built in $((SECONDS - t1)) s"
  done
  log "Kubernetes binaries built in $((SECONDS - t0)) s"
fi

# Debian's etcd-server, unpacked: installing it would also start an etcd service.
etcd_from_debian() {
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || return 1
  mkdir -p "${WORK}/deb"
  chmod 0777 "${WORK}/deb"  # apt-get download runs as the _apt user where it can
  (cd "${WORK}/deb" && { apt-get download -qq etcd-server >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get download -qq etcd-server >/dev/null 2>&1; }; }) \
    || return 1
  local deb
  deb="$(ls "${WORK}"/deb/etcd-server_*.deb 2>/dev/null | head -n1)"
  [[ -n "${deb}" ]] || return 1
  dpkg-deb -x "${deb}" "${WORK}/deb/root" || return 1
  install -m 0755 "${WORK}/deb/root/usr/bin/etcd" "${OUT}/etcd" || return 1
  log "etcd from Debian's etcd-server $(dpkg-deb -f "${deb}" Version)"
}

etcd_from_go() {
  log "building etcd ${ETCD_VERSION} from go.etcd.io/etcd/server/v3"
  mkdir -p "${WORK}/etcd" "${WORK}/bin"
  printf 'module pyhami.invalid/etcd\n\ngo 1.24\n' >"${WORK}/etcd/go.mod"
  (cd "${WORK}/etcd" && "${GO}" get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" \
    && "${GO}" build -p "${JOBS}" -ldflags="-s -w" -o "${WORK}/bin/etcd" go.etcd.io/etcd/server/v3)
  mv -f "${WORK}/bin/etcd" "${OUT}/etcd"
}

if ! have etcd; then
  t0=${SECONDS}
  case "${ETCD_SOURCE}" in
    go) etcd_from_go ;;
    debian)
      if ! etcd_from_debian; then
        log "Debian's etcd-server is not available here; building etcd instead"
        etcd_from_go
      fi ;;
    *) echo "build-control-plane: PYHAMI_ETCD_SOURCE must be go or debian" >&2; exit 2 ;;
  esac
  log "etcd ready in $((SECONDS - t0)) s"
fi

helm_from_go() {
  log "building helm ${HELM_VERSION} from helm.sh/helm/v3"
  mkdir -p "${WORK}/helm" "${WORK}/bin"
  printf 'module pyhami.invalid/helm\n\ngo 1.24\n' >"${WORK}/helm/go.mod"
  (cd "${WORK}/helm" && "${GO}" get "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}")
  # As Helm's Makefile: its version, and the Kubernetes version `helm template` assumes
  # (.Capabilities.KubeVersion) taken from the client-go it is built with.
  local client_go major minor ldflags
  client_go="$(cd "${WORK}/helm" && "${GO}" list -f '{{.Version}}' -m k8s.io/client-go)"
  client_go="${client_go#v0.}"
  major=1
  minor="${client_go%%.*}"
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
  ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X ${pkg}.k8sVersionMajor=${major} -X ${pkg}.k8sVersionMinor=${minor}"
  done
  (cd "${WORK}/helm" && "${GO}" build -p "${JOBS}" -ldflags="${ldflags}" -o "${WORK}/bin/helm" \
    helm.sh/helm/v3/cmd/helm)
  mv -f "${WORK}/bin/helm" "${OUT}/helm"
}

if ! have helm; then
  t0=${SECONDS}
  helm_from_go
  log "helm ready in $((SECONDS - t0)) s"
fi

kueue_from_go() {
  log "building kueue ${KUEUE_VERSION} from sigs.k8s.io/kueue"
  mkdir -p "${WORK}/kueue" "${WORK}/bin"
  printf 'module pyhami.invalid/kueue\n\ngo 1.25\n' >"${WORK}/kueue/go.mod"
  (cd "${WORK}/kueue" && "${GO}" get "sigs.k8s.io/kueue/cmd/kueue@${KUEUE_VERSION}")
  local ldflags="-s -w"
  ldflags+=" -X sigs.k8s.io/kueue/pkg/version.GitVersion=${KUEUE_VERSION}"
  ldflags+=" -X sigs.k8s.io/kueue/pkg/version.BuildDate=1970-01-01T00:00:00Z"
  (cd "${WORK}/kueue" && "${GO}" build -p "${JOBS}" -ldflags="${ldflags}" \
    -o "${WORK}/bin/kueue" sigs.k8s.io/kueue/cmd/kueue)
  # The manifests, from the module the binary was built from.
  local dir
  dir="$(cd "${WORK}/kueue" && "${GO}" list -f '{{.Dir}}' -m sigs.k8s.io/kueue)"
  rm -rf "${OUT}/kueue-manifests"
  mkdir -p "${OUT}/kueue-manifests/crd" "${OUT}/kueue-manifests/webhook"
  cp -r "${dir}/config/components/crd/bases" "${dir}/config/components/crd/patches" \
    "${OUT}/kueue-manifests/crd/"
  cp "${dir}/config/components/webhook/manifests.yaml" "${OUT}/kueue-manifests/webhook/"
  chmod -R u+w "${OUT}/kueue-manifests"
  mv -f "${WORK}/bin/kueue" "${OUT}/kueue"
  echo "${KUEUE_VERSION}" >"${OUT}/kueue.version"
}

if ! have_kueue; then
  t0=${SECONDS}
  kueue_from_go
  log "kueue ready in $((SECONDS - t0)) s"
fi

record_versions
log "done in $((SECONDS - start_all)) s"
echo "${OUT}"
