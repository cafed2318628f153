#!/usr/bin/env bash
# Several machines on one: runs a command next to N simulated hosts, each a Linux network and UTS namespace with its
# own hostname and address, so that Open MPI starts ranks "on other hosts" and they talk over TCP.
#
#   scripts/multihost.sh [--slots 2,2] [--latency MS] [--] command [args...]
#
# --slots S1,S2,...   one host per entry, with that many slots (default 2,2: two hosts of two slots)
# --latency MS        add MS milliseconds of delay (tc netem) to every packet a host sends
#
# The layout: a launcher namespace holds a bridge (br0) and the command; each host namespace has eth0 on that bridge
# with 10.213.0.(10+i)/24, the launcher 10.213.0.1. Nothing is added to this machine's own network namespace (no
# address, no route, no interface), so runs side by side never meet, and no traffic leaves the bridge. Each
# namespace sees an /etc/hosts of its own (ip netns exec bind-mounts /etc/netns/<ns>/hosts) naming every host, so
# the shared /etc/hosts is never edited.
#
# The command runs in the launcher namespace with, in its environment:
#   SHARDKIT_MH_HOSTS      host names with their slots, for mpirun --host / shardkit-run --hosts ("n1:2,n2:2")
#   SHARDKIT_MH_HOSTFILE   the same as an Open MPI hostfile ("n1 slots=2" a line)
#   SHARDKIT_MH_NAMESPACES the host namespaces, in host order (ip netns pids <ns> lists a host's processes)
#   SHARDKIT_MH_AGENT      the rsh agent (below); SHARDKIT_MH_SUBNET the hosts' subnet
#   OMPI_MCA_*             plm_rsh_agent=the agent (no tree spawn), oob/btl TCP on the hosts' subnet, btl
#                          self,vader,tcp: shared memory between ranks of one host, TCP between hosts
# The agent stands in for ssh: `agent HOST COMMAND...` runs COMMAND through /bin/sh in HOST's namespaces, with the
# environment a fresh ssh login would have (HOME, USER, LOGNAME, SHELL and a default PATH; nothing of the caller's),
# so what a program needs on a far host must be forwarded, as on a real cluster.
#
# Exit status: the command's; 77 (with the reason on stderr) when hosts cannot be made here (not root, no ip /
# unshare, namespaces refused, no Open MPI); 2 for bad usage. Everything made is removed on exit, also on failure,
# Ctrl-C or SIGTERM; what a killed (SIGKILL) run left behind is removed by the next run.
set -euo pipefail

SKIP=77
SUBNET=10.213.0
STATE_ROOT=/run/shardkit-multihost

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
skip() { echo "multihost: SKIPPED: $*" >&2; exit "$SKIP"; }

slots=2,2
latency=""
while [ $# -gt 0 ]; do
  case "$1" in
    --slots) slots="${2:?}"; shift 2 ;;
    --latency) latency="${2:?}"; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage ;;
    -*) echo "multihost: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || usage
[[ "$slots" =~ ^[1-9][0-9]*(,[1-9][0-9]*)+$ ]] || { echo "multihost: --slots wants two or more counts, e.g. 2,2" >&2; exit 2; }
[ -z "$latency" ] || [[ "$latency" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "multihost: --latency wants milliseconds" >&2; exit 2; }
IFS=, read -r -a slot_list <<<"$slots"
n_hosts=${#slot_list[@]}
[ "$n_hosts" -le 200 ] || { echo "multihost: at most 200 hosts" >&2; exit 2; }

# ---- can hosts be made here? ------------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || skip "network namespaces need root (this is uid $(id -u))"
for tool in ip unshare; do
  command -v "$tool" >/dev/null || skip "'$tool' is not installed (Debian: apt-get install iproute2 util-linux)"
done
mpirun --version 2>/dev/null | grep -q "Open MPI" || skip "the hosts are started through Open MPI's rsh agent; mpirun is not Open MPI"
if [ -n "$latency" ]; then
  command -v tc >/dev/null || skip "--latency needs 'tc' (Debian: apt-get install iproute2)"
fi

# ---- names, state, cleanup ----------------------------------------------------------------------------------------
prefix="skmh$$"               # this run's namespaces: ${prefix}l (launcher), ${prefix}h1..hN (hosts)
state="$STATE_ROOT/$prefix"   # the agent, the hostfile, and the list of what to remove

remove_namespace() {  # kill what still runs inside (a namespace with processes outlives its deletion), then delete
  local ns=$1 pids
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "/etc/netns/$ns"
}

remove_run() {  # everything a run (this one, or a dead earlier one) made, from its state folder
  local dir=$1 ns
  if [ -f "$dir/namespaces" ]; then
    while read -r ns; do [ -n "$ns" ] && remove_namespace "$ns"; done <"$dir/namespaces"
  fi
  rm -rf "$dir"
}

cleanup() {
  trap - EXIT INT TERM HUP
  remove_run "$state"
  # Nothing stays behind: say so if something did.
  if ip netns list 2>/dev/null | grep -q "^${prefix}[lh]"; then echo "multihost: WARNING: namespaces left: $(ip netns list | grep "^${prefix}")" >&2; fi
}

# Runs that were SIGKILLed (a ctest timeout) could not clean up: remove what they made, judged by their pid.
mkdir -p "$STATE_ROOT"
for dir in "$STATE_ROOT"/skmh*; do
  [ -d "$dir" ] || continue
  pid=${dir##*/skmh}
  if [[ "$pid" =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2>/dev/null; then
    echo "multihost: removing what an earlier run (pid $pid) left behind" >&2
    remove_run "$dir"
  fi
done

mkdir -p "$state"
: >"$state/namespaces"
status=0
trap 'cleanup' EXIT
trap 'status=130; exit 130' INT
trap 'status=143; exit 143' TERM HUP

make_namespace() {
  echo "$1" >>"$state/namespaces"
  ip netns add "$1"
}

launcher="${prefix}l"
if ! make_namespace "$launcher" 2>"$state/err"; then
  skip "cannot make a network namespace: $(cat "$state/err")"
fi
ip -n "$launcher" link set lo up
ip -n "$launcher" link add br0 type bridge
ip -n "$launcher" addr add "$SUBNET.1/24" dev br0
ip -n "$launcher" link set br0 up

hosts_line=""
hostfile="$state/hostfile"
: >"$hostfile"
hosts_table="127.0.0.1 localhost
$SUBNET.1 ${prefix}-launcher"
namespaces=()
for i in $(seq 1 "$n_hosts"); do
  name="${prefix}-node$i"
  hosts_table+=$'\n'"$SUBNET.$((10 + i)) $name"
done
mkdir -p "/etc/netns/$launcher"
printf '%s\n' "$hosts_table" >"/etc/netns/$launcher/hosts"

agent_cases=""
for i in $(seq 1 "$n_hosts"); do
  ns="${prefix}h$i"
  name="${prefix}-node$i"
  addr="$SUBNET.$((10 + i))"
  namespaces+=("$ns")
  make_namespace "$ns"
  mkdir -p "/etc/netns/$ns"
  printf '%s\n' "$hosts_table" >"/etc/netns/$ns/hosts"
  ip -n "$ns" link set lo up
  ip -n "$launcher" link add "v$i" type veth peer name eth0 netns "$ns"
  ip -n "$launcher" link set "v$i" master br0
  ip -n "$launcher" link set "v$i" up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  if [ -n "$latency" ]; then
    if ! ip netns exec "$ns" tc qdisc add dev eth0 root netem delay "${latency}ms" 2>"$state/err"; then
      skip "tc netem refused: $(cat "$state/err") (the kernel needs sch_netem)"
    fi
  fi
  hosts_line+="${hosts_line:+,}$name:${slot_list[$((i - 1))]}"
  echo "$name slots=${slot_list[$((i - 1))]}" >>"$hostfile"
  agent_cases+="  $name|$addr) ns=$ns; name=$name ;;"$'\n'
done

# The rsh agent: Open MPI calls it as `agent HOST COMMAND...` (options of its own, if any, before HOST). The far
# side gets a new UTS namespace named after the host, inside the host's network namespace (and its /etc/hosts), and
# a login-like environment, like sshd gives.
agent="$state/agent"
cat >"$agent" <<EOF
#!/bin/sh
# rsh agent of the simulated hosts of run $prefix (made by scripts/multihost.sh)
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1; shift
case "\$host" in
$agent_cases  *) echo "multihost agent: unknown host '\$host'" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts -- env -i HOME="\${HOME:-/root}" USER="\$(id -un)" LOGNAME="\$(id -un)" \\
  SHELL=/bin/sh PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin \\
  /bin/sh -c 'hostname "\$1" && shift && exec /bin/sh -c "\$*"' sh "\$name" "\$@"
EOF
chmod +x "$agent"

# Can this machine enter the namespaces (skipped if not), and does the agent give the host its name (a failure if
# not)? Said here rather than in mpirun's words.
if ! out=$(ip netns exec "${prefix}h1" unshare --uts true 2>&1); then
  skip "cannot enter a network namespace with a UTS namespace of its own: $out"
fi
out=$(ip netns exec "$launcher" "$agent" "${prefix}-node1" hostname 2>&1) || true
if [ "$(printf '%s\n' "$out" | head -1)" != "${prefix}-node1" ]; then
  echo "multihost: FAILED: the agent did not start ${prefix}-node1 under its own name: $out" >&2
  exit 1
fi

echo "multihost: $n_hosts hosts ($hosts_line) on $SUBNET.0/24${latency:+, ${latency} ms added latency}" >&2

# A batch system's variables would make mpirun (and shardkit-run) use its launcher instead of the agent.
unset_batch=()
for var in $(compgen -e); do
  case "$var" in SLURM_*|PBS_*|LSB_*) unset_batch+=(-u "$var") ;; esac
done
set +e
ip netns exec "$launcher" env "${unset_batch[@]}" \
  SHARDKIT_MH_HOSTS="$hosts_line" SHARDKIT_MH_HOSTFILE="$hostfile" SHARDKIT_MH_NAMESPACES="${namespaces[*]}" \
  SHARDKIT_MH_AGENT="$agent" SHARDKIT_MH_SUBNET="$SUBNET.0/24" \
  OMPI_MCA_plm=rsh OMPI_MCA_plm_rsh_agent="$agent" OMPI_MCA_plm_rsh_no_tree_spawn=1 \
  OMPI_MCA_oob_tcp_if_include="$SUBNET.0/24" OMPI_MCA_btl_tcp_if_include="$SUBNET.0/24" \
  OMPI_MCA_btl=self,vader,tcp \
  "$@" &
child=$!
wait "$child"
status=$?
set -e
exit "$status"
