#!/bin/sh
# A worker of test_torchrun_suite run with --no-python: touches DIR/$RANK.
echo "creating $1/$RANK"
touch "$1/$RANK"
