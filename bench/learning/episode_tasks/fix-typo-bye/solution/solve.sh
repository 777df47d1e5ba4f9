#!/bin/bash
sed -i "s/goodbey/goodbye/" /app/bye.py
