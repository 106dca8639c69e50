#!/usr/bin/env bash
# Runs an MPI program on an emulated slow network: a private network
# namespace whose loopback device is rate-limited by a token bucket, with
# the ranks talking TCP over that loopback only.
#   bench/netem.sh <program> [arguments...]
# Environment:
#   DSOPT_NETEM_RATE   tbf rate (default 1gbit; "none": no limit, plain loopback)
#   DSOPT_NETEM_NP     MPI ranks (default 4)
#   DSOPT_NETEM_BURST  tbf burst (default 256kb), DSOPT_NETEM_LATENCY (default 50ms)
# All ranks share the one loopback device, so the rate is the aggregate of
# every rank's traffic: with 4 ranks sending at once, each gets a quarter.
#
# Needs root (network namespaces and tc). Exit status: the program's, or 77
# with a "netem: skipped" line when it cannot run here (not root, no ip/tc,
# namespace or qdisc creation refused). The namespace is always removed
# afterwards, also on errors and interrupts.
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: netem.sh <program> [arguments...]" >&2
  exit 2
fi

rate=${DSOPT_NETEM_RATE:-1gbit}
np=${DSOPT_NETEM_NP:-4}
burst=${DSOPT_NETEM_BURST:-256kb}
latency=${DSOPT_NETEM_LATENCY:-50ms}

skip() {
  echo "netem: skipped: $*"
  exit 77
}

[ "$(id -u)" = 0 ] || skip "needs root for network namespaces and tc (running as uid $(id -u))"
for tool in ip tc mpirun; do
  command -v "$tool" >/dev/null 2>&1 || skip "'$tool' not found (Debian: apt-get install iproute2 openmpi-bin)"
done

ns=dsopt-bench-$$
if ! err=$(ip netns add "$ns" 2>&1); then
  skip "cannot create network namespace $ns: $err"
fi
# shellcheck disable=SC2317  # called from the traps
cleanup() {
  ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT
trap 'cleanup; trap - EXIT; exit 130' INT
trap 'cleanup; trap - EXIT; exit 143' TERM

if ! err=$(ip -n "$ns" link set lo up 2>&1); then
  skip "cannot bring up loopback in $ns: $err"
fi
if [ "$rate" = none ]; then
  network="loopback of a private network namespace, no rate limit; TCP between ranks"
else
  if ! err=$(tc -n "$ns" qdisc add dev lo root tbf rate "$rate" burst "$burst" latency "$latency" 2>&1); then
    skip "cannot add 'tbf rate $rate' to loopback in $ns: $err"
  fi
  network="loopback of a private network namespace limited to $rate (tbf burst $burst, latency $latency), shared by all $np ranks; TCP between ranks"
fi
network="$network; lo MTU $(ip netns exec "$ns" cat /sys/class/net/lo/mtu 2>/dev/null || echo unknown)"

# shellcheck disable=SC2054  # "tcp,self" is one MCA value
launch=(mpirun -np "$np" --oversubscribe
        --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo
        -x DSOPT_BENCH_NETWORK)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export DSOPT_BENCH_NETWORK="$network"
for var in OMP_NUM_THREADS OMP_PROC_BIND LD_LIBRARY_PATH; do
  if [ -n "${!var:-}" ]; then launch+=(-x "$var"); fi
done

echo "netem: namespace $ns: $network"
ip netns exec "$ns" "${launch[@]}" "$@"
status=$?
if [ "$rate" != none ]; then
  echo "netem: qdisc on lo after the run:"
  tc -n "$ns" -s qdisc show dev lo | sed 's/^/netem:   /'
fi
exit $status
