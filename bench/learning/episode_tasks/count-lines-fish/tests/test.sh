#!/bin/bash
# Reward 1 when lines.txt holds 3, the number of lines of fish.txt.
mkdir -p /logs/verifier
if [ "$(tr -d '[:space:]' < /app/lines.txt 2>/dev/null)" = "3" ]; then
  echo 1 > /logs/verifier/reward.txt; echo "PASS"
else
  echo 0 > /logs/verifier/reward.txt; echo "FAIL: lines.txt holds $(head -c 100 /app/lines.txt 2>/dev/null)"
fi
