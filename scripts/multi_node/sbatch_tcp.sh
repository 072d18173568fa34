#!/usr/bin/env bash
#SBATCH --job-name=gpt2-tcp
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
# Several nodes under Slurm without MPI: srun starts one process per GPU; each takes its rank from
# SLURM_PROCID and receives the NCCL id over TCP from rank 0, which listens on the first node of the
# allocation (-pi tcp -ps HOST:PORT).
#
#   sbatch scripts/multi_node/sbatch_tcp.sh [train_gpt2cu flags...]
#   e.g. sbatch --nodes=4 scripts/multi_node/sbatch_tcp.sh -e d12 -b 32 -t 1024 -z 1 -i ... -j ... -o /shared/out
#
# Run it from the repository on a shared file system (the binary, data and -o must be the same
# paths on every node). Tasks are placed node by node (--distribution=block), so rank r is on node
# r / tasks-per-node and uses GPU r % tasks-per-node (-pg).
#
# Environment (srun passes the job's environment to every task):
#   MASTER_PORT          rank 0's bootstrap port (default: 20000 + job id % 20000, so jobs sharing a
#                        node do not collide)
#   GPT2_TIMEOUT         -pt: seconds a process waits for the others before it aborts (default 300)
#   NCCL_SOCKET_IFNAME   the interface(s) of NCCL's bootstrap and socket transport, e.g. ib0 or eth0;
#                        "^docker0,lo" excludes. Also decides which address rank 0's NCCL id carries.
#   NCCL_IB_HCA, NCCL_IB_GID_INDEX, NCCL_IB_DISABLE, NCCL_NET_GDR_LEVEL   see run_mpirun.sh
#   NCCL_DEBUG=INFO      NCCL prints the transports it chose; check NET/IB is used between nodes
# The first node's hostname must resolve, on that node, to an address the other nodes can reach;
# where it resolves to 127.0.1.1 (some /etc/hosts), set MASTER_ADDR to its network address.
set -euo pipefail
master=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}
port=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
export GPT2_SERVER="$master:$port" GPT2_TIMEOUT=${GPT2_TIMEOUT:-300}
echo "sbatch_tcp.sh: $SLURM_NTASKS processes on $SLURM_JOB_NUM_NODES node(s); rank 0 listens on $GPT2_SERVER"
# --kill-on-bad-exit: one failed task ends the step at once (the others would stop on -pt anyway)
status=0
# the single-quoted command is expanded by each task's shell, with its own SLURM_PROCID
# shellcheck disable=SC2016
srun --kill-on-bad-exit=1 --distribution=block bash -c \
    'exec ./train_gpt2cu -pi tcp -ps "$GPT2_SERVER" -pn "$SLURM_NTASKS" -pr "$SLURM_PROCID" \
          -pg "$SLURM_NTASKS_PER_NODE" -pt "$GPT2_TIMEOUT" "$@"' train_gpt2cu "$@" || status=$?
if [ "$status" -eq 75 ]; then  # stopped by a signal after its checkpoint (llmc/run/stop_signal.h)
    echo "stopped after a checkpoint (exit 75): requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
