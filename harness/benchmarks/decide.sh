#!/usr/bin/env bash
# The decision core's benchmark matrix, as reported in docs/decision-core.md.
set -euo pipefail
pyhami=${PYHAMI:-pyhami}
for nodes in 1 100 1000 5000; do
  for chain in spread binpack mutex,binpack,numa; do
    "$pyhami" bench decide --nodes "$nodes" --chain "$chain" --pods 2000
  done
done
"$pyhami" bench decide --nodes 1000 --chain topology-aware --gpus 4 --pods 2000
"$pyhami" bench decide --nodes 1000 --chain binpack --gpus 2 --pods 2000
