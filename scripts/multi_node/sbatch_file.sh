#!/usr/bin/env bash
#SBATCH --job-name=gpt2-file
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --output=gpt2_%j.log
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
export GPT2_ID_FILE="$shared/nccl_id_$SLURM_JOB_ID" GPT2_TIMEOUT=${GPT2_TIMEOUT:-300}
echo "sbatch_file.sh: $SLURM_NTASKS processes on $SLURM_JOB_NUM_NODES node(s); NCCL id through $GPT2_ID_FILE"
# the single-quoted command is expanded by each task's shell, with its own SLURM_PROCID
# shellcheck disable=SC2016
srun --kill-on-bad-exit=1 --distribution=block bash -c \
    'exec ./train_gpt2cu -pi file -pf "$GPT2_ID_FILE" -pn "$SLURM_NTASKS" -pr "$SLURM_PROCID" \
          -pg "$SLURM_NTASKS_PER_NODE" -pt "$GPT2_TIMEOUT" "$@"' train_gpt2cu "$@"
