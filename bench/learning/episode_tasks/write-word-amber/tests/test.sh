#!/bin/bash
# Reward 1 when /app/word.txt holds the word "amber", ignoring surrounding whitespace.
mkdir -p /logs/verifier
if [ "$(tr -d '[:space:]' < /app/word.txt 2>/dev/null)" = "amber" ]; then
  echo 1 > /logs/verifier/reward.txt; echo "PASS: word.txt holds amber"
else
  echo 0 > /logs/verifier/reward.txt; echo "FAIL: word.txt does not hold amber"
fi
