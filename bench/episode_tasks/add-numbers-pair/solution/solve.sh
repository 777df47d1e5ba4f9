#!/bin/bash
echo $(( $(sed -n 1p /app/pair.txt) + $(sed -n 2p /app/pair.txt) )) > /app/total.txt
