#!/usr/bin/env bash
# Several nodes with mpirun: one process per GPU; the ranks and the NCCL id come from MPI (-pi mpi).
#
#   scripts/multi_node/run_mpirun.sh HOSTFILE GPUS_PER_NODE [train_gpt2cu flags...]
#   e.g. scripts/multi_node/run_mpirun.sh hosts.txt 8 -e d12 -b 32 -t 1024 -z 1 -i ... -j ... -o /shared/out
#
# HOSTFILE has one node per line in Open MPI's syntax, "node001 slots=8". Needs train_gpt2cu built
# with MPI (`make train_gpt2cu` on a machine with Open MPI's mpicxx), at the same path on every node;
# the data, the tokenizer and the output directory (-o) must be on a file system all nodes share:
# every rank writes its own optimizer state file into -o and a resume reads them all. The processes
# are placed node by node (rank r on node r / GPUS_PER_NODE), each on GPU (its rank within the node).
#
# Environment, passed on to every rank (-x) when set:
#   NCCL_SOCKET_IFNAME   the interface(s) of NCCL's bootstrap and socket transport, e.g. eth0 or ib0;
#                        "^docker0,lo" excludes. The default (first non-loopback) can pick a docker
#                        bridge or a management network that the other nodes cannot reach.
#   NCCL_IB_HCA          InfiniBand/RoCE adapters to use, e.g. mlx5_0,mlx5_1 (or ^mlx5_2 to exclude)
#   NCCL_IB_DISABLE=1    no InfiniBand: TCP sockets only (slow; for debugging)
#   NCCL_IB_GID_INDEX    RoCE: the GID index of the RoCE v2 address (often 3)
#   NCCL_NET_GDR_LEVEL   how close NIC and GPU must be for GPUDirect RDMA (e.g. PHB, SYS)
#   NCCL_DEBUG=INFO      NCCL prints what it chose (NET/IB vs NET/Socket, rings, trees): check it once
#   NCCL_DEBUG_SUBSYS    narrows NCCL_DEBUG, e.g. INIT,NET
#   OMPI_MCA_btl_tcp_if_include, OMPI_MCA_oob_tcp_if_include
#                        the interface Open MPI itself uses (it carries only start-up messages here)
#   MPIRUN_EXTRA         more mpirun options, e.g. "--allow-run-as-root" in a container
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,28p' "$0"; exit 1; }
hostfile=$1
gpus_per_node=$2
shift 2
[ -f "$hostfile" ] || { echo "run_mpirun.sh: no hostfile '$hostfile'"; exit 1; }
nodes=$(grep -cvE '^[[:space:]]*(#|$)' "$hostfile")
np=$((nodes * gpus_per_node))

exports=()
for var in NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_IB_DISABLE NCCL_IB_GID_INDEX NCCL_NET_GDR_LEVEL NCCL_DEBUG \
           NCCL_DEBUG_SUBSYS OMPI_MCA_btl_tcp_if_include OMPI_MCA_oob_tcp_if_include; do
    if [ -n "${!var:-}" ]; then exports+=(-x "$var"); fi
done
echo "run_mpirun.sh: $nodes node(s) x $gpus_per_node GPU(s) = $np processes"
# ppr:N:node places N processes per node in rank order; --bind-to none leaves CPU placement to the OS
# (the data loader and the host side of the step use a few threads per process)
# shellcheck disable=SC2086
exec mpirun -np "$np" --hostfile "$hostfile" --map-by "ppr:$gpus_per_node:node" --bind-to none \
    ${exports[@]+"${exports[@]}"} ${MPIRUN_EXTRA:-} ./train_gpt2cu -pi mpi "$@"
