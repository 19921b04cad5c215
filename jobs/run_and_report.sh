#!/usr/bin/env bash
# Run a suite, retry infrastructure errors once, compare with the previous run of the suite, and
# publish: the markdown summary (to the CI step summary when there is one), JUnit XML, a PR comment
# body. Used by the nightly and PR workflows, and as a Ray Job entrypoint:
#   ray job submit --working-dir . -- bash jobs/run_and_report.sh configs/nightly.yaml nightly
#
#   jobs/run_and_report.sh SUITE TRIGGER [regress run options...]
# Exit: 1 when a cell is `fail` or `mismatch`; 0 otherwise (infrastructure `error`s are reported,
# retried once, and not counted as regressions); 2 on a usage or configuration error.
set -uo pipefail
suite=${1:?usage: run_and_report.sh SUITE TRIGGER [regress run options...]}
trigger=${2:?usage: run_and_report.sh SUITE TRIGGER [regress run options...]}
shift 2
results=${RESULTS_DIR:-results}
name=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["suite"])' "$suite") || exit 2

regress run "$suite" --trigger "$trigger" --results-dir "$results" --quiet "$@"
code=$?
[ "$code" -eq 2 ] && exit 2
run_dir=$(ls -d "$results/$name"-*/ 2>/dev/null | sort | tail -n 1)
run_id=$(basename "$run_dir")
if [ "$code" -eq 3 ]; then
  echo "some cells hit infrastructure errors: running them once more" >&2
  regress run "$suite" --trigger "$trigger" --results-dir "$results" --quiet --resume "$run_id" --retry-errors "$@"
  code=$?
fi

report="$run_dir/report.md"
cp "$run_dir/summary.md" "$report"
if regress compare "previous:$name" "latest:$name" --results-dir "$results" --markdown "$run_dir/compare.md" >/dev/null 2>&1 \
   || [ -s "$run_dir/compare.md" ]; then
  { echo; echo "## Compared with the previous $name run"; tail -n +2 "$run_dir/compare.md"; } >> "$report"
fi
cp "$report" "$run_dir/comment.md"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then cat "$report" >> "$GITHUB_STEP_SUMMARY"; fi
echo "results: $run_dir (summary.md, junit.xml, comment.md)"

case "$code" in
  1) exit 1 ;;
  3) echo "infrastructure errors remain after one retry; see $run_dir/summary.md" >&2; exit 0 ;;
  *) exit 0 ;;
esac
