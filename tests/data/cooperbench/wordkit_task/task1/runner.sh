#!/bin/bash
# A runner in CooperBench's convention (a test fixture of scope-marl): written for the task's container,
# where the repository at its base commit is /workspace/repo and the patches are mounted at /patches.
# Usage: runner.sh TESTS_PATCH [FEATURE_PATCH]  (names of files in /patches)
set -e

cleanup() {
    if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
        git reset --hard HEAD > /dev/null 2>&1 || true
        git clean -fdx > /dev/null 2>&1 || true
    fi
}
trap cleanup EXIT INT TERM

TEST_PATCH="$1"
FEATURE_PATCH="$2"
if [[ -z "$TEST_PATCH" ]]; then
    echo "Usage: docker run -v \$(pwd):/patches <image> <test_patch> [feature_patch]"
    exit 1
fi

cd /workspace/repo
git reset --hard HEAD
git clean -fdx

if [[ -n "$FEATURE_PATCH" ]]; then
    if [[ -f "/patches/$FEATURE_PATCH" ]]; then
        git apply --ignore-whitespace "/patches/$FEATURE_PATCH" || git apply --3way "/patches/$FEATURE_PATCH"
    else
        echo "Error: Feature patch not found at /patches/$FEATURE_PATCH"
        exit 1
    fi
fi

if [[ -f "/patches/$TEST_PATCH" ]]; then
    git apply --ignore-whitespace "/patches/$TEST_PATCH" || git apply --3way "/patches/$TEST_PATCH"
else
    echo "Error: Test patch not found at /patches/$TEST_PATCH"
    exit 1
fi

# The test files the tests patch adds, with the standard library's unittest.
TARGETS=$(grep -oE '^\+\+\+ b/.*' "/patches/$TEST_PATCH" | sed 's|^+++ b/||' | sort -u)
python -m unittest -v $TARGETS
