# The alternating loop of the two-build scripts (sourced; pg_ab.sh, sled_ab.sh): ROUNDS rounds of
# both builds, the order swapped every round, so drift in the machine's speed falls on both.
# Each run is the caller's `one_run WHICH LABEL` (WHICH 0 is the old build, 1 the new), whose
# result line (JSON) is shown and collected in the file $RESULTS.
ab_rounds() {
  local round which label order
  for round in $(seq 1 "$ROUNDS"); do
    order=(0 1)
    [ $((round % 2)) -eq 0 ] && order=(1 0)
    for which in "${order[@]}"; do
      label=$([ "$which" = 0 ] && echo old || echo new)
      one_run "$which" "$label" | tee -a "$RESULTS" >&2
    done
  done
  echo "load after=$(cut -d' ' -f1-3 /proc/loadavg)" >&2
}
