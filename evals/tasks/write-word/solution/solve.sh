#!/bin/bash
echo coral > /app/answer.txt
