#!/bin/bash
# Stands in for sbatch on PATH while a command is measured: times and counts every call, then hands
# over to the real sbatch. One line per call in $BENCH_SBATCH_LOG:
#   <start unix s> <end unix s> <exit status> <last word of the output: the job id>
# The end time is when sbatch has returned, i.e. when Slurm has accepted the job.
start=$(date +%s.%N)
out=$("$BENCH_REAL_SBATCH" "$@")
rc=$?
end=$(date +%s.%N)
printf '%s %s %s %s\n' "$start" "$end" "$rc" "${out##* }" >> "$BENCH_SBATCH_LOG"
if [ -n "$out" ]; then printf '%s\n' "$out"; fi
exit $rc
