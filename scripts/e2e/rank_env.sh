#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Per-rank environment for running several ranks on one GPU as if each were a node of its own: NCCL then sends
# everything between them through the network plugin. Wraps the rank's command (mpirun, torchrun --no-python).
# nccl-tests counts the ranks per node by host name and gives each local rank a GPU of its own, so as root the
# rank runs in a UTS namespace of its own with the node's name as host name (left as it is where unshare fails).
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-${SLURM_PROCID:-${RANK:-}}}}}
if [ -z "$rank" ]; then
  echo "rank_env.sh: no rank in the environment (OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID or RANK)" >&2
  exit 2
fi
export NCCL_HOSTID="weft-e2e-node-$rank"
export NCCL_MULTI_RANK_GPU_ENABLE=1   # NCCL versions that refuse several ranks per GPU need this
if [ -n "${WEFT_TELEMETRY_DIR:-}" ]; then mkdir -p "$WEFT_TELEMETRY_DIR"; fi
if [ "${WEFT_E2E_OWN_HOSTNAME:-1}" = 1 ] && [ "$(id -u)" = 0 ] && unshare --uts true 2>/dev/null; then
  exec unshare --uts sh -c 'hostname "$0" && exec "$@"' "$NCCL_HOSTID" "$@"
fi
exec "$@"
