#!/bin/bash
wc -l < /app/fish.txt > /app/lines.txt
