#!/bin/bash
wc -l < /app/notes.txt > /app/count.txt
