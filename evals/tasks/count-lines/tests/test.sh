#!/bin/bash
# Reward 1 when count.txt holds 5, the number of lines of notes.txt.
mkdir -p /logs/verifier
if [ "$(tr -d '[:space:]' < /app/count.txt 2>/dev/null)" = "5" ]; then
  echo 1 > /logs/verifier/reward.txt; echo "PASS"
else
  echo 0 > /logs/verifier/reward.txt; echo "FAIL: count.txt holds $(head -c 100 /app/count.txt 2>/dev/null)"
fi
