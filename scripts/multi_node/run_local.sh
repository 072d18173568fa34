#!/usr/bin/env bash
# Several GPUs of one node without MPI: starts one train_gpt2cu process per GPU, each with its rank
# (-pr), the process count (-pn) and rank 0's address on this node (-ps 127.0.0.1:PORT, -pi tcp);
# waits for all of them and fails if any fails. Rank 0 prints to the terminal, rank r > 0 writes
# its errors to LOGDIR/rank_r.log.
#
#   scripts/multi_node/run_local.sh NUM_GPUS [train_gpt2cu flags...]
#   e.g. scripts/multi_node/run_local.sh 8 -e d12 -b 32 -t 1024 -z 1 -i '...train*.bin' -j '...val*.bin' -o out_d12
#
# Environment:
#   PORT                rank 0's TCP port for the bootstrap (default 29500)
#   LOGDIR              where ranks 1.. write their output (default build/multi_gpu_logs)
#   TRAIN_GPT2CU        the binary (default ./train_gpt2cu)
#   NCCL_DEBUG=INFO     NCCL prints the transports it chose (NVLink "P2P/CUMEM" or "P2P/IPC", "SHM", ...)
#   NCCL_P2P_DISABLE=1  forces shared memory instead of NVLink/PCIe peer access (to compare, or on
#                       machines whose peer access is broken)
# Under mpirun the same works with `mpirun -np NUM_GPUS ./train_gpt2cu ...` (needs an MPI build).
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,17p' "$0"; exit 1; }
n=$1
shift
port=${PORT:-29500}
logdir=${LOGDIR:-build/multi_gpu_logs}
binary=${TRAIN_GPT2CU:-./train_gpt2cu}
mkdir -p "$logdir"
[ -x "$binary" ] || { echo "run_local.sh: build the trainer first (make train_gpt2cu)"; exit 1; }

pids=()
for ((r = 1; r < n; r++)); do
    "$binary" -pi tcp -pn "$n" -pr "$r" -ps "127.0.0.1:$port" "$@" > "$logdir/rank_$r.log" 2>&1 &
    pids+=($!)
done
status=0
"$binary" -pi tcp -pn "$n" -pr 0 -ps "127.0.0.1:$port" "$@" || status=$?
for ((r = 1; r < n; r++)); do
    if ! wait "${pids[$((r - 1))]}"; then
        echo "run_local.sh: rank $r failed; its output ($logdir/rank_$r.log) ends with:"
        tail -n 5 "$logdir/rank_$r.log"
        status=1
    fi
done
exit $status
