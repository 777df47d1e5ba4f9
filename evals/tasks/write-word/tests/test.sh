#!/bin/bash
# Reward 1 when /app/answer.txt holds the word "coral", ignoring surrounding whitespace.
mkdir -p /logs/verifier
if [ "$(tr -d '[:space:]' < /app/answer.txt 2>/dev/null)" = "coral" ]; then
  echo 1 > /logs/verifier/reward.txt; echo "PASS: answer.txt holds coral"
else
  echo 0 > /logs/verifier/reward.txt; echo "FAIL: answer.txt does not hold coral"
fi
