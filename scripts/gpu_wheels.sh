#!/usr/bin/env bash
# Wheels the GPU machine's image lacks (it has torch, triton, numpy, transformers, pytest, attrs),
# for its Python 3.12 on x86-64, into .whl/ (git-ignored): `make gpu-check` installs them there.
set -euo pipefail
PIP="${PIP:-python3 -m pip}"
mkdir -p .whl
$PIP download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl jsonschema jsonschema-specifications referencing rpds-py
ls .whl
