#!/usr/bin/env bash
# Carries on the 30-epoch large-batch table on a GPU machine (a lent one gives a session 15
# minutes): the runs already made are read back from the committed runs file, the missing ones
# run (up to PARALLEL side by side on the one GPU) until SECONDS have passed, and the runs file
# and the table land in OUTDIR. Run again to go on. Afterwards, here: copy OUTDIR/cells.jsonl
# over benchmarks/results/large_batch_batches_30epochs_h100_cells.jsonl and build the table with
# this script's bench_large_batch.py arguments, --cells that file and --offline instead of
# --reuse (the table is labelled with the machine the runs recorded). Usage, from the
# repository root:
#
#     bash benchmarks/gpu_large_batch.sh OUTDIR [SECONDS] [PARALLEL]
#
# PARALLEL (at least 2) runs share the GPU; the runs file's keys say one thread per worker,
# which is what side-by-side runs use.
# PYTHON picks the interpreter (default python3); the source tree is used in place.
set -u
out=${1:?usage: bash benchmarks/gpu_large_batch.sh OUTDIR [SECONDS] [PARALLEL]}
seconds=${2:-420}
parallel=${3:-6}
python=${PYTHON:-python3}
[ "$parallel" -ge 2 ] || { echo "PARALLEL must be at least 2 (the runs file's runs went side by side)"; exit 2; }
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cp benchmarks/results/large_batch_batches_30epochs_h100_cells.jsonl "$out/cells.jsonl"
# the cells and starting rates of the committed table: keep them, or no run is read back
cells=momentum:256,momentum:4096,lars:4096,momentum:8192,nesterov:8192,lars:8192,lamb:8192
cells=$cells,momentum:16384,lars:16384
rates=lars:4096=16,lars:8192=32,lars:16384=64,nesterov:8192=0.8,lamb:8192=0.045
timeout -k 5 "$seconds" "$python" benchmarks/bench_large_batch.py --part batches \
  --batches 256,4096,8192,16384 --only "$cells" --start-lr "$rates" --epochs 30 --seeds 3 \
  --parallel "$parallel" --no-elastic --reuse --cells "$out/cells.jsonl" \
  --stem large_batch_batches_30epochs 2>&1 | tee "$out/large_batch.log"
cp benchmarks/results/large_batch_batches_30epochs_*nvidia* "$out/" 2>/dev/null
exit 0
