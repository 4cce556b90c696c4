#!/usr/bin/env bash
# CooperBench's runner contract: runner.sh TESTS_PATCH [FEATURE_PATCH], run inside the repository tree.
# Applies the feature patch (when given and not empty) and the hidden tests, then runs the test files
# the tests patch adds with the standard library's unittest (it prints "Ran N tests").
set -euo pipefail
tests_patch="$1"
feature_patch="${2:-}"
if [ -n "$feature_patch" ] && [ -s "$feature_patch" ]; then
    git apply "$feature_patch"
fi
git apply "$tests_patch"
mapfile -t files < <(git apply --numstat "$tests_patch" | cut -f3)
exec python -m unittest -v "${files[@]}"
