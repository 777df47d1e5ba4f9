#!/bin/bash
echo $(( $(sed -n 1p /app/two.txt) + $(sed -n 2p /app/two.txt) )) > /app/added.txt
