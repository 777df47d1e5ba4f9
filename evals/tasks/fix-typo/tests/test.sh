#!/bin/bash
# Reward 1 when greet.py prints exactly "hello, world".
mkdir -p /logs/verifier
if [ "$(python3 /app/greet.py 2>&1)" = "hello, world" ]; then
  echo 1 > /logs/verifier/reward.txt; echo "PASS"
else
  echo 0 > /logs/verifier/reward.txt; echo "FAIL: greet.py printed: $(python3 /app/greet.py 2>&1 | head -c 200)"
fi
