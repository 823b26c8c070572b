#!/usr/bin/env bash
# Carries on a 30-epoch large-batch table on a GPU machine (a lent one gives a session 15
# minutes): the runs already made are read back from the committed runs file, the missing ones
# run (up to PARALLEL side by side on the one GPU) until SECONDS have passed, and the runs file
# and the table land in OUTDIR. Run again to go on. MODEL picks the table: lenet5-bn (LeNet-5
# with batch norm, the default; its runs file is large_batch_batches_30epochs_h100_cells.jsonl)
# or cnn (the 4.8M-parameter CNN; large_batch_cnn_30epochs_cells.jsonl). Afterwards, here: copy
# OUTDIR/cells.jsonl over that runs file and build the table with this script's
# bench_large_batch.py arguments, --cells that file and --offline instead of --reuse (the table
# is labelled with the machines the runs recorded: a lent machine is an H100 one session and an
# H200 the next, and the header says how many runs each made). Usage, from the repository root:
#
#     bash benchmarks/gpu_large_batch.sh OUTDIR [SECONDS] [PARALLEL] [MODEL]
#
# PARALLEL (at least 2) runs share the GPU; the runs file's keys say one thread per worker,
# which is what side-by-side runs use. The CNN's cells run in three sweeps side by side: the three
# that decide the goal (the baseline at 256, momentum SGD and LARS at 8192), the tuned
# Nesterov and LAMB at 8192, and LARS at 8192 with no exclusion (trust_exclude none: biases take
# the ratio too; a table of its own, large_batch_cnn_30epochs_lars_all), each cell's grid at
# seed 0 then its other seeds.
# PYTHON picks the interpreter (default python3); the source tree is used in place.
set -u
out=${1:?usage: bash benchmarks/gpu_large_batch.sh OUTDIR [SECONDS] [PARALLEL] [MODEL]}
seconds=${2:-420}
parallel=${3:-6}
model=${4:-lenet5-bn}
python=${PYTHON:-python3}
[ "$parallel" -ge 2 ] || { echo "PARALLEL must be at least 2 (the runs file's runs went side by side)"; exit 2; }
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
sweep() {  # the bench with the settings every run of the table shares, then its own
  timeout -k 5 "$seconds" "$python" benchmarks/bench_large_batch.py --part batches --epochs 30 \
    --no-elastic --reuse --cells "$out/cells.jsonl" "$@"
}
case $model in
lenet5-bn)
  cp benchmarks/results/large_batch_batches_30epochs_h100_cells.jsonl "$out/cells.jsonl"
  # the cells and starting rates of the committed table: keep them, or no run is read back
  cells=momentum:256,momentum:4096,lars:4096,momentum:8192,nesterov:8192,lars:8192,lamb:8192
  cells=$cells,momentum:16384,lars:16384
  rates=lars:4096=16,lars:8192=32,lars:16384=64,nesterov:8192=0.8,lamb:8192=0.045
  sweep --batches 256,4096,8192,16384 --only "$cells" --start-lr "$rates" --seeds 3 \
    --parallel "$parallel" --stem large_batch_batches_30epochs 2>&1 | tee "$out/large_batch.log"
  cp benchmarks/results/large_batch_batches_30epochs_*nvidia* "$out/" 2>/dev/null
  ;;
cnn)
  cp benchmarks/results/large_batch_cnn_30epochs_cells.jsonl "$out/cells.jsonl" 2>/dev/null
  # the grids' centres: where the runs so far point (LARS's best was 1, bracketed by 0.5 and 2;
  # Nesterov's 0.025 and LAMB's 0.0225, bracketed); a grid whose best is at its edge is extended
  # (LARS with no exclusion: 4, the top of its grid so far)
  rates=lars:8192=1,nesterov:8192=0.025,lamb:8192=0.0225
  common=(--model cnn --batches 256,8192 --start-lr "$rates" --stem large_batch_cnn_30epochs)
  third=$(( parallel / 3 > 1 ? parallel / 3 : 2 ))
  sweep "${common[@]}" --only momentum:256,momentum:8192,lars:8192 --seeds 3 \
    --parallel "$third" >"$out/goal.log" 2>&1 &
  sweep "${common[@]}" --only nesterov:8192,lamb:8192 --seeds 3 \
    --parallel "$third" >"$out/tuned.log" 2>&1 &
  # LARS with every tensor under the ratio (biases included): its own table
  sweep --model cnn --batches 256,8192 --start-lr lars:8192=1 --trust-exclude none \
    --only lars:8192 --seeds 3 --parallel "$third" --stem large_batch_cnn_30epochs_lars_all \
    >"$out/lars_all.log" 2>&1
  wait
  cat "$out/goal.log" "$out/tuned.log" "$out/lars_all.log"
  ;;
*) echo "MODEL must be lenet5-bn or cnn, got $model"; exit 2 ;;
esac
exit 0
