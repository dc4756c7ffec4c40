#!/usr/bin/env bash
# The long fuzz campaign: every target of tests/scheduler/daemon/test_fuzz_inputs.py with
# PYHAMI_FUZZ_EXAMPLES generated inputs each (default 17,000: six targets, over 100,000
# inputs with the known hostile ones), then one line per target with the counts:
# inputs tried, server errors (>= 500), unanswered, invariant violations, seconds.
#
#   scripts/fuzz-long.sh                  # the campaign
#   PYHAMI_FUZZ_EXAMPLES=2000 scripts/fuzz-long.sh -k inventory   # a shorter one
#
# Extra arguments go to pytest. The JSON report is kept at $PYHAMI_FUZZ_REPORT
# (default: fuzz-long-report.jsonl in a fresh temporary folder, printed at the end).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3 )}"
export PYHAMI_FUZZ_EXAMPLES="${PYHAMI_FUZZ_EXAMPLES:-17000}"
export PYHAMI_FUZZ_REPORT="${PYHAMI_FUZZ_REPORT:-$(mktemp -d)/fuzz-long-report.jsonl}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
: > "$PYHAMI_FUZZ_REPORT"
started=$(date +%s)
"$PYTHON" -m pytest tests/scheduler/daemon/test_fuzz_inputs.py -q -p no:cacheprovider -o timeout=0 \
  -W ignore::hypothesis.errors.HypothesisWarning "$@"
status=$?
"$PYTHON" - "$PYHAMI_FUZZ_REPORT" "$started" <<'PY'
import json, sys, time
rows = [target for line in open(sys.argv[1]) if line.strip()
        for target in json.loads(line)["targets"]]
print(f"\n{'target':<24}{'inputs':>10}{'5xx':>7}{'no answer':>11}{'violations':>12}"
      f"{'failed checks':>15}{'seconds':>9}")
for row in rows:
    print(f"{row['target']:<24}{row['inputs']:>10}{row['server_errors']:>7}"
          f"{row['no_answer']:>11}{row['invariant_violations']:>12}"
          f"{row['failed_batch_checks']:>15}{row['seconds']:>9}")
total = sum(row["inputs"] for row in rows)
print(f"{'total':<24}{total:>10}{sum(r['server_errors'] for r in rows):>7}"
      f"{sum(r['no_answer'] for r in rows):>11}"
      f"{sum(r['invariant_violations'] for r in rows):>12}"
      f"{sum(r['failed_batch_checks'] for r in rows):>15}"
      f"{int(time.time()) - int(sys.argv[2]):>9}")
print(f"report: {sys.argv[1]}")
PY
exit $status
