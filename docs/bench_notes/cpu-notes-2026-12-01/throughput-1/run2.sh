#!/bin/bash
# run.sh again for rounds 5-10 (`for i in 5 6 7 8 9 10`)
