#!/usr/bin/env bash
# s21 visit 5: the bench of record at b08ed9a with FlashMLA beside it (results in v5/w4/),
# from a copy of the tree in .dev/final, FlashMLA's library in .dev/fmlib:
cd .dev/final && COMMIT=b08ed9a FM_LIB=../fmlib/libflashmla.so BUDGET=360 OUT=$OUT bash benchmarks/short_visit.sh
