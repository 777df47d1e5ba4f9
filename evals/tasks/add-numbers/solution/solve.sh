#!/bin/bash
echo $(( $(sed -n 1p /app/numbers.txt) + $(sed -n 2p /app/numbers.txt) )) > /app/sum.txt
