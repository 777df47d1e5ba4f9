#!/bin/bash
# Reward 1 when bye.py prints exactly "goodbye".
mkdir -p /logs/verifier
if [ "$(python3 /app/bye.py 2>&1)" = "goodbye" ]; then
  echo 1 > /logs/verifier/reward.txt; echo "PASS"
else
  echo 0 > /logs/verifier/reward.txt; echo "FAIL: bye.py printed: $(python3 /app/bye.py 2>&1 | head -c 200)"
fi
