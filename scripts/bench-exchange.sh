#!/usr/bin/env bash
# CPU and memory of distributed TPC-H queries against one process, side by side.
#
#   scripts/bench-exchange.sh [--scale 1] [--partitions "2 4 8"] [--queries "9 18"]
#                             [--modes "pool process"] [--runs 1]
#
# For each partition count and query: total CPU (user + sys of the driver and
# every worker, from /usr/bin/time on `dfx run`) distributed and single-process
# (`dfx run --local`), their ratio, and the peak RSS of the single process
# against the largest and the median worker (each worker runs under
# /usr/bin/time through `--worker`), in each worker mode asked for (a pooled
# worker serves many tasks, so its peak is over all of them). `dfx run`
# shuts its pool down in order before it exits, so the pooled workers' CPU
# is counted too. With --runs R each figure is the median of R runs, the
# single-process and distributed runs taken in turn so that a busy spell on
# a shared machine falls on both. Uses the release build; data is generated
# by `dfx tpch` on first use and reused.
set -euo pipefail
cd "$(dirname "$0")/.."

scale=1
partitions="2 4 8"
queries="9 18"
modes="pool process"
runs=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --scale) scale="$2"; shift 2 ;;
        --partitions) partitions="$2"; shift 2 ;;
        --queries) queries="$2"; shift 2 ;;
        --modes) modes="$2"; shift 2 ;;
        --runs) runs="$2"; shift 2 ;;
        *) echo "bench-exchange.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

target="${CARGO_TARGET_DIR:-target}"
dfx="$target/release/dfx"
data_dir="$target/tpch-data"
if [[ ! -x "$dfx" || ! -f "$target/release/libdfx_plugin.so" ]]; then
    echo "bench-exchange.sh: build first: cargo build --release -p dfx-plugin -p dfx-host" >&2
    exit 1
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# user+sys seconds and max RSS (KiB) of one command, from GNU time.
measure() {
    if ! /usr/bin/time -f "%U %S %M" -o "$scratch/time" "$@" >/dev/null 2>"$scratch/stderr"; then
        cat "$scratch/stderr" >&2
        exit 1
    fi
    read -r user sys rss <"$scratch/time"
    cpu="$(echo "$user + $sys" | bc)"
}

# The median of the numbers given.
median() {
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

printf '| N | query | mode | local CPU s | distributed CPU s | ratio | local RSS MB | worker RSS MB max / median | max/local |\n'
printf '|--:|---|---|--:|--:|--:|--:|--:|--:|\n'
for n in $partitions; do
    # Generates the dataset once (and checks the answers agree).
    "$dfx" tpch --scale "$scale" --partitions "$n" --queries "$(echo "$queries" | tr ' ' ',')" \
        --runs 1 --data-dir "$data_dir" >"$scratch/tpch-$n.txt" 2>&1 ||
        { cat "$scratch/tpch-$n.txt" >&2; exit 1; }
    dataset="$data_dir/sf$scale-p$n"
    tables=()
    for dir in "$dataset"/*/; do
        name="$(basename "$dir")"
        tables+=(--table "$name=$dir")
    done
    for q in $queries; do
        sql="$(cat "host/queries/q$q.sql")"
        for mode in $modes; do
            local_cpus=(); local_rsss=(); dist_cpus=(); maxes=(); medians=()
            for ((run = 0; run < runs; run++)); do
                measure "$dfx" run --local --partitions "$n" "${tables[@]}" -- "$sql"
                local_cpus+=("$cpu"); local_rsss+=("$rss")
                rm -f "$scratch/workers"
                measure "$dfx" run --partitions "$n" "${tables[@]}" --worker-mode "$mode" \
                    --worker /usr/bin/time --worker-arg -a --worker-arg -o \
                    --worker-arg "$scratch/workers" --worker-arg -f --worker-arg "%M" \
                    --worker-arg "$dfx" --worker-arg worker -- "$sql"
                dist_cpus+=("$cpu")
                read -r worker_max worker_median < <(sort -n "$scratch/workers" |
                    awk '{ v[NR] = $1 } END { print v[NR], v[int((NR + 1) / 2)] }')
                maxes+=("$worker_max"); medians+=("$worker_median")
            done
            local_cpu="$(median "${local_cpus[@]}")"; local_rss="$(median "${local_rsss[@]}")"
            dist_cpu="$(median "${dist_cpus[@]}")"
            worker_max="$(median "${maxes[@]}")"; worker_median="$(median "${medians[@]}")"
            printf '| %s | q%s | %s | %.2f | %.2f | %.2f | %d | %d / %d | %.0f%% |\n' \
                "$n" "$q" "$mode" "$local_cpu" "$dist_cpu" \
                "$(echo "$dist_cpu / $local_cpu" | bc -l)" "$((local_rss / 1024))" \
                "$((worker_max / 1024))" "$((worker_median / 1024))" \
                "$(echo "100 * $worker_max / $local_rss" | bc -l)"
        done
    done
done
