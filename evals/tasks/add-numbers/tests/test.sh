#!/bin/bash
# Reward 1 when sum.txt holds 6912, the sum of the two numbers.
mkdir -p /logs/verifier
if [ "$(tr -d '[:space:]' < /app/sum.txt 2>/dev/null)" = "6912" ]; then
  echo 1 > /logs/verifier/reward.txt; echo "PASS"
else
  echo 0 > /logs/verifier/reward.txt; echo "FAIL: sum.txt holds $(head -c 100 /app/sum.txt 2>/dev/null)"
fi
