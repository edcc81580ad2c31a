#!/usr/bin/env bash
# RASCAL ablation on digits: the three weightings (agreement = the method, current, uniform = SupCon),
# each pre-trained with the demo's settings and evaluated linearly; prints a table. ~5 min on 2 CPU cores.
#   bash scripts/rascal_ablation_digits.sh [SEED]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
SEED="${1:-0}"
OUT="save/rascal_ablation/seed_${SEED}"
rm -rf "$OUT"
for W in agreement current uniform; do
    LINEAR_EPOCHS=10 digits_run "$OUT/$W" "$SEED" main_supcon.py --method RASCAL --rascal_weighting "$W" \
        --epochs 30 --learning_rate 0.2 --temp 0.1
done
"$PY" - "$OUT" <<'PYEOF'
import csv, glob, json, os, sys
out = sys.argv[1]
print(f'{"weighting":10s} {"test top-1":>10s} {"drift mean":>10s} {"w entropy":>10s} {"ranked rows":>11s}')
for w in ('agreement', 'current', 'uniform'):
    res = json.load(open(glob.glob(os.path.join(out, w, 'linear', '**', 'results.json'), recursive=True)[0]))
    rows = list(csv.DictReader(open(glob.glob(os.path.join(out, w, 'pretrain', '**', 'metrics.csv'), recursive=True)[0])))
    last = rows[-1]
    print(f'{w:10s} {res["final_test_acc"]:10.2f} {float(last["train/rascal/rank_drift_mean"]):10.3f} '
          f'{float(last["train/rascal/w_entropy"]):10.3f} {float(last["train/rascal/ranked_row_rate"]):11.2f}')
PYEOF
