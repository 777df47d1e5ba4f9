#!/bin/bash
# Reward 1 when added.txt holds 1000, the sum of the two numbers.
mkdir -p /logs/verifier
if [ "$(tr -d '[:space:]' < /app/added.txt 2>/dev/null)" = "1000" ]; then
  echo 1 > /logs/verifier/reward.txt; echo "PASS"
else
  echo 0 > /logs/verifier/reward.txt; echo "FAIL: added.txt holds $(head -c 100 /app/added.txt 2>/dev/null)"
fi
