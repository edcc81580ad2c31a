#!/usr/bin/env bash
# What made SupCon + CARROT collapse on digits (docs/results.md): the ablation's settings (15 epochs,
# lr 0.2, temperature 0.1, 10-class pre-training, 5-epoch linear evaluation), one seed, CARROT's first
# definition (balanced, no cap: --carrot_alpha_max inf) and with one change each; alpha_max1 is today's
# default. About 3 minutes on 2 CPU cores.
#   bash scripts/carrot_collapse_digits.sh [SEED]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
SEED="${1:-0}"
OUT="save/carrot_collapse_digits/seed_${SEED}"
rm -rf "$OUT"
mkdir -p "$OUT"
declare -A VARIANT=([default]="--carrot_alpha_max inf" [head]="--carrot_on head --carrot_alpha_max inf"
                    [lr0.05]="--learning_rate 0.05 --carrot_alpha_max inf" [alpha_max1]="--carrot_alpha_max 1")
ORDER="default head lr0.05 alpha_max1"
for V in $ORDER; do
    # shellcheck disable=SC2086
    digits_run "$OUT/$V" "$SEED" main_supcon.py --carrot --epochs 15 --learning_rate 0.2 --temp 0.1 ${VARIANT[$V]} \
        > "$OUT/$V.log" 2>&1 || { cat "$OUT/$V.log"; exit 1; }
done
ROWS=()
for V in $ORDER; do ROWS+=("SupCon + CARROT, ${V}=$OUT/$V/linear"); done
"$PY" compare.py "${ROWS[@]}"
echo "last epoch's corridor and weight (pre-training):"
for V in $ORDER; do
    "$PY" -c "import csv,glob,sys; r=list(csv.DictReader(open(glob.glob(sys.argv[1]+'/**/metrics.csv',recursive=True)[0])))[-1]; print(f\"{sys.argv[2]:10s} L {float(r['train/carrot/L']):.4f}  U {float(r['train/carrot/U']):.4f}  alpha {float(r['train/carrot/alpha']):.4g}\")" "$OUT/$V/pretrain" "$V"
done
