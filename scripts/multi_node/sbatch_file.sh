#!/usr/bin/env bash
#SBATCH --job-name=gpt2-file
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --output=gpt2_%j.log
# preemption and the time limit: 120 s before the end every task gets SIGUSR1 (Slurm's SIGTERM on
# preemption or scancel does the same): the run finishes its step, writes a checkpoint and exits with
# status 75, and this script requeues the job, which continues from that checkpoint. Give the run
# -o (a shared directory) and -y 1 (-y 1 with no checkpoint yet starts from scratch). doc/reliability.md
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
# Several nodes under Slurm without MPI and without a TCP port of our own: rank 0 writes the NCCL id
# to a file on a shared file system and the other ranks read it (-pi file -pf PATH). Useful where
# the nodes' firewalls allow NCCL's traffic but not a port we pick.
#
#   sbatch scripts/multi_node/sbatch_file.sh [train_gpt2cu flags...]
#
# The file's path includes the job id: rank 0 refuses a path that already exists (an earlier run's
# id would send the others to a rank 0 that is gone), and removes the file once all ranks have joined.
#
# Environment:
#   SHARED_DIR           a directory every node sees (default: the current directory)
#   GPT2_TIMEOUT         -pt (default 300). On NFS a new file can take up to the attribute-cache time
#                        (acdirmax, often 60 s) to appear on other nodes: keep -pt well above it.
#   NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_IB_GID_INDEX, NCCL_DEBUG   see run_mpirun.sh
set -euo pipefail
shared=${SHARED_DIR:-$PWD}
# a requeued job keeps its id: the restart count keeps each start's file new
export GPT2_ID_FILE="$shared/nccl_id_${SLURM_JOB_ID}_${SLURM_RESTART_COUNT:-0}" GPT2_TIMEOUT=${GPT2_TIMEOUT:-300}
echo "sbatch_file.sh: $SLURM_NTASKS processes on $SLURM_JOB_NUM_NODES node(s); NCCL id through $GPT2_ID_FILE"
status=0
# the single-quoted command is expanded by each task's shell, with its own SLURM_PROCID
# shellcheck disable=SC2016
srun --kill-on-bad-exit=1 --distribution=block bash -c \
    'exec ./train_gpt2cu -pi file -pf "$GPT2_ID_FILE" -pn "$SLURM_NTASKS" -pr "$SLURM_PROCID" \
          -pg "$SLURM_NTASKS_PER_NODE" -pt "$GPT2_TIMEOUT" "$@"' train_gpt2cu "$@" || status=$?
if [ "$status" -eq 75 ]; then  # stopped by a signal after its checkpoint (llmc/run/stop_signal.h)
    echo "stopped after a checkpoint (exit 75): requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
