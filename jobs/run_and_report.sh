#!/usr/bin/env bash
# Run a suite, retry infrastructure errors once, compare with the previous run of the suite, and
# publish: the markdown report (to the CI step summary when there is one), JUnit XML, a PR comment
# body. Used by the nightly and PR workflows, and as a Ray Job entrypoint:
#   ray job submit --working-dir . -- bash jobs/run_and_report.sh configs/nightly.yaml nightly
#
#   jobs/run_and_report.sh SUITE TRIGGER [regress run options...]
# The report's first line is the verdict (`regress assess`). Exit: 1 when a cell is `fail` or
# `mismatch`; 4 when the run is broken (more than MAX_ERROR_SHARE of the cells, default 0.1, or any
# reference cell, could not be measured after one retry); 2 on a usage or configuration error;
# 3 when UNDECIDED (no regression, but cells still inconclusive after the suite's extension and
# relaunches: the headline names them and what would decide each); 0 when GREEN.
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
if [ -z "$run_dir" ]; then
  echo "BROKEN RUN: regress run exited $code and wrote no results (is Ray reachable?)" >&2
  [ -n "${GITHUB_STEP_SUMMARY:-}" ] && echo "BROKEN RUN: regress run exited $code and wrote no results" >> "$GITHUB_STEP_SUMMARY"
  exit 4
fi
run_id=$(basename "$run_dir")
if grep -q '"status":"error"' "$run_dir/cells.jsonl" 2>/dev/null; then
  echo "some cells hit infrastructure errors: running them once more" >&2
  regress run "$suite" --trigger "$trigger" --results-dir "$results" --quiet --resume "$run_id" --retry-errors "$@"
fi

headline=$(regress assess "$run_dir" --max-error-share "${MAX_ERROR_SHARE:-0.1}")
verdict=$?
report="$run_dir/report.md"
# Markdown from the run (server errors, a PR's sglang output) is code in the report, never links or mentions.
{ regress assess "$run_dir" --max-error-share "${MAX_ERROR_SHARE:-0.1}" --markdown; echo; cat "$run_dir/summary.md"; } > "$report"
if regress compare "previous:$name" "latest:$name" --results-dir "$results" --markdown "$run_dir/compare.md" >/dev/null 2>&1 \
   || [ -s "$run_dir/compare.md" ]; then
  { echo; echo "## Compared with the previous $name run"; tail -n +2 "$run_dir/compare.md"; } >> "$report"
fi
cp "$report" "$run_dir/comment.md"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then cat "$report" >> "$GITHUB_STEP_SUMMARY"; fi
echo "$headline"
echo "results: $run_dir (report.md, summary.md, junit.xml, comment.md)"
exit "$verdict"
