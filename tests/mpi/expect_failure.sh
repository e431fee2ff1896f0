#!/bin/sh
# Runs a command that must fail: passes when it exits non-zero within LIMIT seconds and its
# output matches the extended regex EXPECT. Usage: EXPECT=regex LIMIT=s expect_failure.sh CMD...
out=$(timeout "${LIMIT:-60}" "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ]; then echo "expect_failure: the command succeeded"; exit 1; fi
if [ "$rc" -eq 124 ]; then echo "expect_failure: still running after ${LIMIT:-60} s"; exit 1; fi
if ! printf '%s\n' "$out" | grep -Eq "$EXPECT"; then echo "expect_failure: no line matches '$EXPECT'"; exit 1; fi
echo "expect_failure: exited $rc with the expected message"
