#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Per-rank environment for running several ranks on one GPU as if each were a node of its own: NCCL then sends
# everything between them through the network plugin. Wraps the rank's command (mpirun, torchrun --no-python).
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-${SLURM_PROCID:-${RANK:-}}}}}
if [ -z "$rank" ]; then
  echo "rank_env.sh: no rank in the environment (OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID or RANK)" >&2
  exit 2
fi
export NCCL_HOSTID="weft-e2e-node-$rank"
export NCCL_MULTI_RANK_GPU_ENABLE=1   # NCCL versions that refuse several ranks per GPU need this
if [ -n "${WEFT_TELEMETRY_DIR:-}" ]; then mkdir -p "$WEFT_TELEMETRY_DIR"; fi
exec "$@"
