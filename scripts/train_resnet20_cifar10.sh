#!/usr/bin/env bash
# ResNet-20 on the real CIFAR-10: 2 logical CPU devices with all-reduce, SGD with momentum, a
# cosine schedule after one warm-up epoch, crop, flip and 12-pixel cutout. Resumable: run it
# again and it continues from the newest checkpoint in TRAIN_DIR.
#   [EPOCHS=N] scripts/train_resnet20_cifar10.sh DATA_DIR [TRAIN_DIR] [extra cifar10_train flags...]
# Extra flags come after the script's own, and a flag given twice takes its last value, so
# e.g. '--cutout 0' runs the recipe without cutout.
# DATA_DIR holds cifar-10-batches-bin's files (see the data section of the README). EPOCHS
# (default 140, the run the README reports) sets the schedule's length; raising it on a resumed
# run stretches the cosine.
set -euo pipefail
# DATA_DIR and TRAIN_DIR are the caller's paths: relative ones are taken from where it was started.
here=$PWD
from_caller() { case "$1" in /*) echo "$1" ;; *) echo "$here/$1" ;; esac; }
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
data_dir=$(from_caller "$1")
train_dir=$(from_caller "${2:-train_dir_resnet20}")
shift $(( $# >= 2 ? 2 : 1 ))
resume=()
ls -d "$train_dir"/ckpt-* > /dev/null 2>&1 && resume=(--resume)
exec build/bin/cifar10_train --data_dir "$data_dir" --model resnet20 \
  --devices /cpu:0,/cpu:1 --reduction all_reduce --batch_size 128 \
  --optimizer sgd --lr 0.1 --momentum 0.9 --weight_decay 5e-4 --schedule cosine --warmup_epochs 1 \
  --cutout 12 --epochs "${EPOCHS:-140}" --eval_every 2 --save_every 390 --keep_checkpoints 3 --log_every 50 \
  --train_dir "$train_dir" --seed 1 "${resume[@]}" "$@"
