#!/usr/bin/env bash
# The grid of sweeps/untuned_noise_digits.yaml (its first lines say what it runs); flags pass on to sweep.py (--jobs, --only, --status).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" && exec "$PY" sweep.py sweeps/untuned_noise_digits.yaml "$@"
