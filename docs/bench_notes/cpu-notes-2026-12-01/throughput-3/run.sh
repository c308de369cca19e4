#!/bin/bash
# ../throughput-2/run.sh with six rounds (`for i in 1 2 3 4 5 6`), writing here
