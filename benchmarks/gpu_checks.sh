#!/usr/bin/env bash
# The checks that need a GPU, in one go (CI has none): the CUDA tests (tests/gpu: NCCL, the
# timeline's device-drained phases, fp16 and bf16 autocast) and the GPU rows of the precision
# benchmark. Run from the repository root on a machine with CUDA, torch and Fashion-MNIST:
#
#     bash benchmarks/gpu_checks.sh OUTDIR     # logs and the result files land in OUTDIR
#
# PYTHON picks the interpreter (default python3); the source tree is used in place.
set -u
out=${1:?usage: bash benchmarks/gpu_checks.sh OUTDIR}
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; \
print('torch', torch.__version__, torch.cuda.get_device_name(0))" || exit 1
status=0
timeout 200 "$python" -m pytest -q -p no:cacheprovider -m "" tests/gpu 2>&1 | tee "$out/gpu_tests.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
timeout 330 "$python" benchmarks/bench_large_batch.py --part precision --device cuda --repeats 2 \
  2>&1 | tee "$out/precision.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
cp benchmarks/results/large_batch_precision_*nvidia* "$out/" 2>/dev/null
exit $status
