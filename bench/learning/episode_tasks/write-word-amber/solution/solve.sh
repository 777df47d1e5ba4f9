#!/bin/bash
echo amber > /app/word.txt
