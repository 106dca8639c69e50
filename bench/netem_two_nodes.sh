#!/usr/bin/env bash
# Runs an MPI program on two emulated nodes joined by a slow link: one
# private network namespace, a veth device per node inside it with its own
# address (node A 10.77.1.1 on dA, node B 10.77.2.1 on dB), each rank's TCP
# transport on its node's device, and an htb on the namespace's loopback
# (where the packets between the two addresses travel) that limits only the
# traffic between the two addresses, one class per direction; everything
# else (mpirun's own channel) takes a fast default class.
#
# Inside a node the ranks talk through shared memory, as on a real node:
# mpirun is given two host names, "nodea" and "nodeb", and a remote-launch
# agent (a script written here) that starts each "host"'s Open MPI daemon on
# this machine instead of logging in anywhere. Each daemon's ranks are then
# one node to Open MPI (MPI_Comm_split_type finds them; its vader transport
# joins them, each node's shared-memory files in a directory of its own),
# and the ranks of the two daemons talk over TCP through the shaped link.
# DSOPT_NETEM_INSIDE=tcp keeps the ranks of a node on TCP too (one daemon,
# the nodes declared by rank only).
#   bench/netem_two_nodes.sh <program> [arguments...]
# Environment:
#   DSOPT_NETEM_RATE            rate of each direction between the nodes (default 1gbit)
#   DSOPT_NETEM_NP              MPI ranks (default 4)
#   DSOPT_NETEM_RANKS_PER_NODE  ranks per node (default NP / 2): ranks 0 .. R-1 are node A, R .. 2R-1 node B
#   DSOPT_NETEM_COUNTERS        write the cross-node byte counters here too (key=value lines)
#   DSOPT_NETEM_INSIDE          shm (default: shared memory inside a node) or tcp
# After the run it prints the htb counters of the two cross-node classes,
#   netem2: A->B bytes <n> packets <n>
#   netem2: B->A bytes <n> packets <n>
#   netem2: inside bytes <n> packets <n>       (the default class: TCP inside the nodes, mpirun's channel)
# (bytes as tc counts them: IP packets with their headers).
#
# Only the addresses 10.77.1.1 and 10.77.2.1 inside the namespace this
# script creates are used. Needs root. Exit status: the program's, or 77
# with a "netem2: skipped" line when it cannot run here. The namespace is
# always removed afterwards, also on errors and interrupts.
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: netem_two_nodes.sh <program> [arguments...]" >&2
  exit 2
fi

rate=${DSOPT_NETEM_RATE:-1gbit}
np=${DSOPT_NETEM_NP:-4}
rpn=${DSOPT_NETEM_RANKS_PER_NODE:-$((np / 2))}
inside=${DSOPT_NETEM_INSIDE:-shm}
addr_a=10.77.1.1
addr_b=10.77.2.1

skip() {
  echo "netem2: skipped: $*"
  exit 77
}

[ "$(id -u)" = 0 ] || skip "needs root for network namespaces and tc (running as uid $(id -u))"
for tool in ip tc mpirun; do
  command -v "$tool" >/dev/null 2>&1 || skip "'$tool' not found (Debian: apt-get install iproute2 openmpi-bin)"
done
if [ "$inside" != shm ] && [ "$inside" != tcp ]; then
  echo "netem2: DSOPT_NETEM_INSIDE is shm or tcp, not '$inside'" >&2
  exit 2
fi
if [ "$rpn" -lt 1 ] || [ $((2 * rpn)) -ne "$np" ]; then
  echo "netem2: $np ranks are not two nodes of $rpn" >&2
  exit 2
fi

ns=dsopt-2n-$$
wrapper=$(mktemp /tmp/dsopt-2n-rank.XXXXXX)
agent=$(mktemp /tmp/dsopt-2n-agent.XXXXXX)
shm=$(mktemp -d /dev/shm/dsopt-2n.XXXXXX)
# shellcheck disable=SC2317  # called from the traps
cleanup() {
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$wrapper" "$agent" "$shm"
}
trap cleanup EXIT
trap 'cleanup; trap - EXIT; exit 130' INT
trap 'cleanup; trap - EXIT; exit 143' TERM

if ! err=$(ip netns add "$ns" 2>&1); then
  skip "cannot create network namespace $ns: $err"
fi
run_ip() {
  if ! err=$(ip -n "$ns" "$@" 2>&1); then
    skip "ip $*: $err"
  fi
}
run_tc() {
  if ! err=$(tc -n "$ns" "$@" 2>&1); then
    skip "tc $*: $err"
  fi
}
run_ip link set lo up
run_ip link add dA type veth peer name dB
run_ip addr add "$addr_a/24" dev dA
run_ip addr add "$addr_b/24" dev dB
run_ip link set dA up
run_ip link set dB up

# Traffic between the two addresses travels over lo: shape it there.
run_tc qdisc add dev lo root handle 1: htb default 30
run_tc class add dev lo parent 1: classid 1:1 htb rate 100gbit
run_tc class add dev lo parent 1:1 classid 1:10 htb rate "$rate" ceil "$rate"
run_tc class add dev lo parent 1:1 classid 1:20 htb rate "$rate" ceil "$rate"
run_tc class add dev lo parent 1:1 classid 1:30 htb rate 100gbit ceil 100gbit
run_tc filter add dev lo parent 1: protocol ip prio 1 u32 \
  match ip src "$addr_a/32" match ip dst "$addr_b/32" flowid 1:10
run_tc filter add dev lo parent 1: protocol ip prio 1 u32 \
  match ip src "$addr_b/32" match ip dst "$addr_a/32" flowid 1:20

# Each rank's TCP transport on its node's device, and its node's
# shared-memory directory, from its rank.
mkdir -p "$shm/a" "$shm/b"
cat > "$wrapper" <<EOF
#!/usr/bin/env bash
rank=\${OMPI_COMM_WORLD_RANK:?not started by Open MPI mpirun}
if [ "\$rank" -lt $rpn ]; then dev=dA; node=a; else dev=dB; node=b; fi
export OMPI_MCA_btl_tcp_if_include=\$dev GLOO_SOCKET_IFNAME=\$dev
export OMPI_MCA_btl_vader_backing_directory=$shm/\$node
exec "\$@"
EOF
chmod 755 "$wrapper"
# The remote-launch agent: "<options> <host> <command>" -> the command, here.
cat > "$agent" <<'EOF'
#!/usr/bin/env bash
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
shift
exec bash -c "$*"
EOF
chmod 755 "$agent"

network="two emulated nodes of $rpn ranks ($addr_a on dA, $addr_b on dB) in a private network namespace, $rate each way between them (htb on lo), TCP between the nodes"
launch=(mpirun -np "$np" --oversubscribe --mca btl_tcp_disable_family 6 --mca oob_tcp_if_include lo
        -x DSOPT_BENCH_NETWORK)
# shellcheck disable=SC2054  # "vader,tcp,self" is one MCA value
if [ "$inside" = shm ]; then
  network+=", shared memory inside a node"
  # (rtc_hwloc_vmhole none: the two daemons of one machine would otherwise
  # both write the topology into shared memory at the same address.)
  launch+=(--host "nodea:$rpn,nodeb:$rpn" --mca plm_rsh_agent "$agent" --mca btl vader,tcp,self
           --mca rtc_hwloc_vmhole none --mca mpi_yield_when_idle 1)
else
  network+=", TCP inside a node (unlimited)"
  launch+=(--mca btl tcp,self)
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export DSOPT_BENCH_NETWORK="$network" DSOPT_NETEM_CROSS_CLASSES=1:10,1:20
for var in OMP_NUM_THREADS OMP_PROC_BIND LD_LIBRARY_PATH PYTHONPATH DSOPT_LIBRARY_DIR DSOPT_NETEM_CROSS_CLASSES; do
  if [ -n "${!var:-}" ]; then launch+=(-x "$var"); fi
done

echo "netem2: namespace $ns: $network"
ip netns exec "$ns" "${launch[@]}" "$wrapper" "$@"
status=$?

# "class htb 1:10 ... \n Sent 123 bytes 45 pkt ..." -> bytes and packets per class.
stats=$(tc -n "$ns" -s class show dev lo)
counter() {  # classid -> "bytes packets"
  awk -v id="$1" '$1 == "class" && $3 == id { want = 1; next }
                  want && $1 == "Sent" { print $2, $4; exit }' <<<"$stats"
}
read -r ab_bytes ab_pkts <<<"$(counter 1:10)"
read -r ba_bytes ba_pkts <<<"$(counter 1:20)"
read -r in_bytes in_pkts <<<"$(counter 1:30)"
echo "netem2: A->B bytes ${ab_bytes:-?} packets ${ab_pkts:-?}"
echo "netem2: B->A bytes ${ba_bytes:-?} packets ${ba_pkts:-?}"
echo "netem2: inside bytes ${in_bytes:-?} packets ${in_pkts:-?}"
if [ -n "${DSOPT_NETEM_COUNTERS:-}" ]; then
  printf 'a_to_b_bytes=%s\nb_to_a_bytes=%s\ninside_bytes=%s\n' \
    "${ab_bytes:-}" "${ba_bytes:-}" "${in_bytes:-}" > "$DSOPT_NETEM_COUNTERS"
fi
exit $status
