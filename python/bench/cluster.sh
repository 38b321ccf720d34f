#!/usr/bin/env bash
# A Ray cluster of a head and worker nodes on this machine, each worker node
# in mount and network namespaces of its own: it sees only the installed
# wheel, its own /tmp, and a bridge to the other nodes and the driver
# (python/bench/cluster.py says how):
#
#   python/bench/cluster.sh [show] [--workers N]
#       start it, print what each node sees, stop it
#   python/bench/cluster.sh tpch [--scale 0.1] [--queries all] [--workers N]
#       [--durability object_store|local|both] [--s3-latency-ms MS]
#       [--node-latency-ms MS] [--link-rate 1gbit] [--set KEY=VALUE]
#       [--record FILE]
#       TPC-H with the tables and the shuffle on a local S3 (moto_server,
#       MS further away), or the shuffle streamed between the nodes over
#       Arrow Flight (local, both; the nodes MS apart, which needs nft(8)),
#       every task on a worker node, each answer against stock DataFusion;
#       prints what each node saw and ran, and the shuffle's requests by
#       path (cluster_tpch.py)
#
# Run as root (mount and network namespaces) after python/run-tests.sh, whose
# python/.venv holds Ray, moto and the dfx-engine wheel (or PYTHON=... an
# interpreter with them). Nothing of the cluster outlives the script: its
# nodes' processes are killed by namespace on any exit, Ctrl-C included.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$(dirname "$here")")"
python="${PYTHON:-$here/../.venv/bin/python}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"

command="${1:-show}"
[[ $# -gt 0 ]] && shift
case "$command" in
show) script=("$here/cluster.py" show) ;;
tpch) script=("$here/cluster_tpch.py") ;;
-h | --help)
    sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
*)
    echo "cluster.sh: unknown command $command (want show or tpch)" >&2
    exit 2
    ;;
esac

# The namespaces of the nodes, written by cluster.py as it starts them: a
# backstop for a Python killed before its own cleanup ran.
state="$(mktemp -t dfx-cluster-state.XXXXXX)"
cleanup() {
    "$python" "$here/cluster.py" stop "$state" || true
    rm -f "$state"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# From / : Ray puts the driver's working directory on its workers' sys.path,
# and python/'s source tree holds a dfx_engine without its native module.
cd /
"$python" "${script[@]}" --state "$state" "$@"
