#!/usr/bin/env bash
# examples/ddp_fashion_mnist on 2 ranks, one short epoch on a subset in FP16 AMP, in BF16 and with
# BF16 parameters rounded stochastically (the ranks must draw the same bits): each must learn, end
# with identical replicas and exit cleanly. Skips (passes) without Debian's dataset-fashion-mnist.
# Usage: ddp_fashion_mnist_test.sh MPIRUN_TEST_SH DDP_FASHION_MNIST (as the sh_test passes them).
set -uo pipefail
mpirun_test=$1
prog=$2
data=/usr/share/datasets/fashion-mnist
if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
  echo "SKIP: no Fashion-MNIST in $data (apt-get install dataset-fashion-mnist)"
  exit 0
fi
# One short epoch per precision: FP16 AMP with a GradScaler, BF16 autocast without one, BF16
# parameters without masters (the flags word-split on purpose).
for amp in --amp --amp=bf16 "--amp=bf16-params --master-weights=stochastic"; do
  # shellcheck disable=SC2086
  out=$("$mpirun_test" 2 "$prog" $amp --epochs 1 --train-samples 4096 --batch-size 64 2>&1)
  status=$?
  echo "$out" | tail -n 20
  (( status == 0 )) || { echo "FAIL ($amp): exit status $status"; exit 1; }
  grep -qF "parameters identical on all 2 ranks: yes" <<<"$out" || { echo "FAIL ($amp): the replicas differ"; exit 1; }
  # One epoch of 64 steps reaches about 75% (10 classes: chance is 10%).
  accuracy=$(sed -n 's/^final test accuracy \([0-9.]*\)%.*/\1/p' <<<"$out")
  [[ -n $accuracy ]] && awk -v a="$accuracy" 'BEGIN { exit !(a >= 65) }' ||
    { echo "FAIL ($amp): accuracy '$accuracy'% < 65%"; exit 1; }
  echo "PASS ($amp): test accuracy $accuracy% after one data-parallel epoch"
done
