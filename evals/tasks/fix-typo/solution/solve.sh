#!/bin/bash
sed -i "s/wprld/world/" /app/greet.py
