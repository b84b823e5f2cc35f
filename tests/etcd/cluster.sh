#!/usr/bin/env bash
# A real 3-member etcd cluster on 127.0.0.1, for the tests of the etcd
# backend: members m0, m1 and m2 (etcd-server's /usr/bin/etcd), everything
# under DIR. Needs etcd-server, etcd-client and python3 (scripts/setup
# installs them); no root.
#
#   tests/etcd/cluster.sh start DIR          # a new cluster; prints its endpoints
#   tests/etcd/cluster.sh stop DIR           # every member (and the watchdog) gone
#   tests/etcd/cluster.sh kill DIR N         # SIGKILL member N, return once it is gone
#   tests/etcd/cluster.sh start-member DIR N # member N back, same ports and data
#   tests/etcd/cluster.sh leader DIR         # the index N of the current leader
#
# Ports are free ones the kernel picks (6 per cluster), so clusters in two
# DIRs run side by side. In DIR: endpoints (one line, the client addresses,
# "127.0.0.1:P0,127.0.0.1:P1,127.0.0.1:P2"), endpoint.N (member N's client
# address), ports.N ("CLIENT PEER"), mN.log, mN.pid, mN.data/.
#
# With ETCD_CLUSTER_TLS_DIR set, start makes the members serve their clients
# over TLS with client certificates (mutual TLS), from the files there:
# ca.pem (the authority), server.pem and server.key (naming IP 127.0.0.1),
# client.pem and client.key (for etcdctl). The other commands follow (DIR/tls
# remembers where the files are); peers speak plaintext among themselves.
#
# With ETCD_CLUSTER_OWNER_PID set, start also leaves a watchdog that stops
# the cluster when that process exits, so a test that crashes leaves no etcd
# behind; stop ends the watchdog too.
#
# With ETCD_CLUSTER_HOST set (every command alike), the members listen on
# that address instead of 127.0.0.1: one of a network namespace's, for
# bench/chaos_soak.py's hosts.
#
# Elections are fast (heartbeat 50 ms, election timeout 500 ms): a killed
# leader is replaced in about a second. Every wait below is bounded.
set -euo pipefail

usage() {
  echo "usage: $0 start DIR | stop DIR | kill DIR N | start-member DIR N | leader DIR" >&2
  exit 2
}

readonly members=(0 1 2)
self=$(readlink -f "$0")
readonly self
readonly start_timeout_s=20
readonly host=${ETCD_CLUSTER_HOST:-127.0.0.1}
readonly stop_timeout_s=5

# etcdctl_ DIR ARGS...: etcdctl for the cluster in DIR (with its TLS files, if it has them).
etcdctl_() {
  local dir=$1 tls=()
  shift
  if [[ -f $dir/tls ]]; then
    local files
    files=$(<"$dir/tls")
    tls=(--cacert "$files/ca.pem" --cert "$files/client.pem" --key "$files/client.key")
  fi
  ETCDCTL_API=3 etcdctl --dial-timeout=1s --command-timeout=2s "${tls[@]}" "$@"
}

# member_pid DIR N: member N's pid if it is running (an etcd on DIR's data,
# not a zombie and not a later process that reused the number); else nothing.
member_pid() {
  local pidfile=$1/m$2.pid pid state
  [[ -f $pidfile ]] || return 0
  pid=$(<"$pidfile")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 0
  [[ -n $state && $state != Z && $state != X ]] || return 0
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--data-dir $1/m$2.data" || return 0
  echo "$pid"
}

# wait_gone DIR N SECONDS: until member N has exited; fails after SECONDS.
wait_gone() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    [[ -z $(member_pid "$1" "$2") ]] && return 0
    sleep 0.1
  done
  return 1
}

# free_ports COUNT: COUNT distinct loopback ports free now (bound at once, then released).
free_ports() {
  python3 - "$1" "$host" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((sys.argv[2], 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

initial_cluster() {
  local dir=$1 n peer parts=()
  for n in "${members[@]}"; do
    read -r _ peer <"$dir/ports.$n"
    parts+=("m$n=http://$host:$peer")
  done
  local IFS=,
  echo "${parts[*]}"
}

# launch DIR N STATE: member N in the background, its pid in mN.pid.
launch() {
  local dir=$1 n=$2 state=$3 client peer scheme=http tls=()
  read -r client peer <"$dir/ports.$n"
  if [[ -f $dir/tls ]]; then
    local files
    files=$(<"$dir/tls")
    scheme=https
    tls=(--cert-file "$files/server.pem" --key-file "$files/server.key"
      --client-cert-auth --trusted-ca-file "$files/ca.pem")
  fi
  etcd --name "m$n" --data-dir "$dir/m$n.data" "${tls[@]}" \
    --listen-client-urls "$scheme://$host:$client" \
    --advertise-client-urls "$scheme://$host:$client" \
    --listen-peer-urls "http://$host:$peer" \
    --initial-advertise-peer-urls "http://$host:$peer" \
    --initial-cluster "$(initial_cluster "$dir")" \
    --initial-cluster-token "$(<"$dir/token")" \
    --initial-cluster-state "$state" \
    --heartbeat-interval 50 --election-timeout 500 \
    --logger zap --log-outputs stderr \
    </dev/null >>"$dir/m$n.log" 2>&1 &
  echo $! >"$dir/m$n.pid"
}

# serving DIR N: waits (at most 5 s) until member N serves its peers. A new
# member first asks the others whether it was bootstrapped already, and one
# that listens but does not serve yet costs it a 1 s timeout (2 s of the
# cluster's start); one that does not listen yet answers at once.
serving() {
  local i
  for ((i = 0; i < 250; i++)); do
    grep -q '"now serving peer/client/metrics"' "$1/m$2.log" 2>/dev/null && return 0
    [[ -n $(member_pid "$1" "$2") ]] || return 0
    sleep 0.02
  done
}

# healthy DIR ENDPOINTS SECONDS [N...]: until etcdctl finds every endpoint
# healthy; fails early when one of the members N has exited.
healthy() {
  local dir=$1 endpoints=$2 seconds=$3 deadline n
  shift 3
  deadline=$((SECONDS + seconds))
  while ((SECONDS < deadline)); do
    if etcdctl_ "$dir" --endpoints "$endpoints" endpoint health >/dev/null 2>&1; then
      return 0
    fi
    for n in "$@"; do
      [[ -n $(member_pid "$dir" "$n") ]] || return 1
    done
    sleep 0.2
  done
  return 1
}

show_logs() {
  local dir=$1 n
  shift
  for n in "$@"; do
    echo "--- $dir/m$n.log (tail)" >&2
    tail -n 15 "$dir/m$n.log" >&2 2>/dev/null || true
  done
}

stop_watchdog() {
  local dir=$1 pid
  [[ -f $dir/watchdog.pid ]] || return 0
  pid=$(<"$dir/watchdog.pid")
  rm -f "$dir/watchdog.pid"
  # Its session (bash and tail), if it is still the watchdog: once it runs
  # stop itself its command line no longer names etcd-cluster-watchdog.
  if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "etcd-cluster-watchdog"; then
    kill -TERM -- "-$pid" 2>/dev/null || true
  fi
}

# One member at a time: members stopped together pass the leadership back
# and forth, each waiting for a transfer to one that is stopping too (5 s).
stop_members() {
  local dir=$1 n pid
  for n in "${members[@]}"; do
    pid=$(member_pid "$dir" "$n")
    [[ -n $pid ]] || continue
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_gone "$dir" "$n" "$stop_timeout_s"; then
      pid=$(member_pid "$dir" "$n")
      if [[ -n $pid ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
      wait_gone "$dir" "$n" "$stop_timeout_s" || {
        echo "etcd member m$n (pid $pid) did not exit after SIGKILL" >&2
        return 1
      }
    fi
  done
}

cmd_stop() {
  local dir=$1
  stop_watchdog "$dir"
  stop_members "$dir"
}

cmd_start() {
  local dir=$1 attempt n ports client_list=() endpoints
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  cmd_stop "$dir"
  # A port taken between free_ports and etcd's bind fails the attempt: try
  # again with new ports.
  for attempt in 1 2 3; do
    rm -rf "$dir"/m?.data "$dir"/m?.log "$dir"/m?.pid "$dir"/ports.? "$dir"/endpoint* "$dir/token" \
      "$dir/tls"
    if [[ -n ${ETCD_CLUSTER_TLS_DIR:-} ]]; then
      (cd "$ETCD_CLUSTER_TLS_DIR" && pwd) >"$dir/tls"
    fi
    read -r -a ports <<<"$(free_ports 6)"
    client_list=()
    for n in "${members[@]}"; do
      echo "${ports[$n]} ${ports[$((n + 3))]}" >"$dir/ports.$n"
      echo "$host:${ports[$n]}" >"$dir/endpoint.$n"
      client_list+=("$host:${ports[$n]}")
    done
    endpoints=$(IFS=,; echo "${client_list[*]}")
    echo "muster-test-$$-$RANDOM" >"$dir/token"
    for n in "${members[@]}"; do
      launch "$dir" "$n" new
      serving "$dir" "$n"
    done
    if healthy "$dir" "$endpoints" "$start_timeout_s" "${members[@]}"; then
      echo "$endpoints" >"$dir/endpoints"
      if [[ -n ${ETCD_CLUSTER_OWNER_PID:-} ]]; then
        # Stops the cluster once the owner exits (tail --pid returns then). In
        # a session of its own, so that stop_watchdog ends tail with it.
        # shellcheck disable=SC2016  # expanded by the inner bash
        setsid bash -c 'tail --pid="$1" -f /dev/null && exec "$2" stop "$3"' \
          etcd-cluster-watchdog "$ETCD_CLUSTER_OWNER_PID" "$self" "$dir" \
          </dev/null >/dev/null 2>&1 &
        echo $! >"$dir/watchdog.pid"
      fi
      echo "$endpoints"
      return 0
    fi
    if grep -q "address already in use" "$dir"/m?.log 2>/dev/null && ((attempt < 3)); then
      stop_members "$dir"
      continue
    fi
    echo "the etcd cluster in $dir did not become healthy within ${start_timeout_s}s" >&2
    show_logs "$dir" "${members[@]}"
    stop_members "$dir" || true
    return 1
  done
}

check_member() {
  [[ $1 =~ ^[0-2]$ ]] || {
    echo "member index must be 0, 1 or 2, not '$1'" >&2
    exit 2
  }
}

cmd_kill() {
  local dir=$1 n=$2 pid
  check_member "$n"
  pid=$(member_pid "$dir" "$n")
  [[ -n $pid ]] || {
    echo "etcd member m$n in $dir is not running" >&2
    return 1
  }
  kill -KILL "$pid"
  wait_gone "$dir" "$n" "$stop_timeout_s" || {
    echo "etcd member m$n (pid $pid) did not exit after SIGKILL" >&2
    return 1
  }
}

cmd_start_member() {
  local dir=$1 n=$2
  check_member "$n"
  if [[ -n $(member_pid "$dir" "$n") ]]; then
    echo "etcd member m$n in $dir is already running" >&2
    return 1
  fi
  launch "$dir" "$n" existing
  if ! healthy "$dir" "$(<"$dir/endpoint.$n")" "$start_timeout_s" "$n"; then
    echo "etcd member m$n in $dir did not become healthy within ${start_timeout_s}s" >&2
    show_logs "$dir" "$n"
    return 1
  fi
}

# leader_of ENDPOINTS: reads `etcdctl endpoint status -w json` and prints the
# index in ENDPOINTS of the member whose own id is the leader id it reports.
leader_of() {
  python3 -c '
import json, sys
endpoints = sys.argv[1].split(",")
try:
    statuses = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
for s in statuses:
    status = s.get("Status", {})
    if status.get("leader") and status.get("header", {}).get("member_id") == status["leader"]:
        print(endpoints.index(s["Endpoint"]))
        break
' "$1"
}

# Asks the running members only: a dead one would cost etcdctl's dial timeout.
cmd_leader() {
  local dir=$1 deadline leader n live
  deadline=$((SECONDS + 10))
  while ((SECONDS < deadline)); do
    live=()
    for n in "${members[@]}"; do
      if [[ -n $(member_pid "$dir" "$n") ]]; then live+=("$(<"$dir/endpoint.$n")"); fi
    done
    leader=
    if ((${#live[@]} > 0)); then
      leader=$(etcdctl_ "$dir" --endpoints "$(IFS=,; echo "${live[*]}")" endpoint status -w json \
        2>/dev/null | leader_of "$(<"$dir/endpoints")") || true
    fi
    if [[ -n $leader ]]; then
      echo "$leader"
      return 0
    fi
    sleep 0.1
  done
  echo "no etcd member in $dir reported itself leader within 10s" >&2
  return 1
}

(($# >= 2)) || usage
case $1 in
  start) (($# == 2)) || usage; cmd_start "$2" ;;
  stop) (($# == 2)) || usage; cmd_stop "$2" ;;
  kill) (($# == 3)) || usage; cmd_kill "$2" "$3" ;;
  start-member) (($# == 3)) || usage; cmd_start_member "$2" "$3" ;;
  leader) (($# == 2)) || usage; cmd_leader "$2" ;;
  *) usage ;;
esac
