#!/usr/bin/env bash
# Generates agent/deviceplugin/_v1beta1 (api_pb2.py, api_pb2.pyi, api_pb2_grpc.py) from
# agent/deviceplugin/api.proto, the kubelet's device plugin API. The generated modules are
# committed; run this only after replacing api.proto, then commit what changed.
#
#   scripts/generate-deviceplugin.sh
#
# Settings (environment):
#   PYTHON   the interpreter with grpcio-tools (default: .venv/bin/python, else python3)
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-}"
if [[ -z "${PYTHON}" ]]; then
  if [[ -x "${REPO}/.venv/bin/python" ]]; then PYTHON="${REPO}/.venv/bin/python"; else PYTHON=python3; fi
fi
PACKAGE="agent/deviceplugin/_v1beta1"

# protoc names imports after the proto's path: laying the file out as the package makes the
# generated gRPC module import "agent.deviceplugin._v1beta1.api_pb2" rather than "api_pb2".
WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT
mkdir -p "${WORK}/${PACKAGE}"
cp "${REPO}/agent/deviceplugin/api.proto" "${WORK}/${PACKAGE}/api.proto"

"${PYTHON}" -m grpc_tools.protoc -I "${WORK}" \
  --python_out="${WORK}" --pyi_out="${WORK}" --grpc_python_out="${WORK}" \
  "${WORK}/${PACKAGE}/api.proto"

for name in api_pb2.py api_pb2.pyi api_pb2_grpc.py; do
  cp "${WORK}/${PACKAGE}/${name}" "${REPO}/${PACKAGE}/${name}"
done
echo "generated ${PACKAGE}/{api_pb2.py,api_pb2.pyi,api_pb2_grpc.py}"
