#!/usr/bin/env bash
# An emulated cluster on one Linux machine (root): N hosts, each a network namespace with its own
# address, hostname and sshd (key authentication only), joined by a bridge; optional per-host
# bandwidth and latency with tc. For Parallax's multi-machine tests and benchmarks.
#
#   scripts/emulated_cluster.sh up N [--rate 100mbit] [--delay 1ms]   # prints the state folder
#   scripts/emulated_cluster.sh down [--force]                   # removes all of it; safe twice
#
# There is one cluster a machine (its names and addresses are fixed): the process that ran 'up'
# owns it while it lives, and another process's 'up' or 'down' fails, naming it, instead of
# pulling the cluster from under its jobs ('down --force' takes it anyway).
#
# Host i (1..N) is namespace pxh$i, hostname h$i, address 10.213.0.$((i+1)); the root namespace
# is 10.213.0.1 on bridge pxbr0, so a driver can run here. The state folder
# (${PARALLAX_CLUSTER_DIR:-/tmp/parallax-cluster}) holds the keys, an ssh_config for
# `ssh -F`, a resource file `resources` (2 slots a host) and `hosts` (name address lines).
set -euo pipefail

state="${PARALLAX_CLUSTER_DIR:-/tmp/parallax-cluster}"
bridge=pxbr0
subnet=10.213.0

owner_file=/run/parallax-emulated-cluster.owner

usage() { sed -n '2,18p' "$0" >&2; exit 2; }

started() {  # a process's start time (clock ticks after boot), which a reused pid does not keep
    sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{print $20}'
}

refuse_if_owned() {  # exits if a live process other than the caller owns the cluster
    [ -f "$owner_file" ] || return 0
    local pid since
    read -r pid since < "$owner_file" || return 0
    if [ "$pid" != "$PPID" ] && [ -n "$since" ] && [ "$(started "$pid")" = "$since" ]; then
        echo "emulated_cluster: the cluster is in use by process $pid" \
             "($(tr '\0' ' ' < "/proc/$pid/cmdline" | cut -c1-100)); wait for it to end," \
             "or take the cluster with 'down --force'" >&2
        exit 1
    fi
}

down() {
    [ "${1:-}" = "--force" ] || refuse_if_owned
    if [ -d "$state" ]; then
        for pidfile in "$state"/sshd-*.pid; do
            [ -e "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
        done
    fi
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^pxh[0-9]*$' || true); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns delete "$ns"
        rm -rf "/etc/netns/$ns"
    done
    # Deleting a namespace frees its end of a veth pair later, in the kernel's cleanup work, and
    # the next 'up' would find the bridge end still there (RTNETLINK: File exists). Deleting the
    # bridge end removes both ends at once; then wait until the kernel shows none.
    local tries=0
    while links=$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
                  grep -E '^(pxv|pxe)[0-9]+$' || true); [ -n "$links" ]; do
        for link in $links; do ip link delete "$link" 2>/dev/null || true; done
        tries=$((tries + 1))
        [ $tries -lt 100 ] || { echo "emulated_cluster: links $links do not go away" >&2; exit 1; }
        sleep 0.1
    done
    ip link delete "$bridge" 2>/dev/null || true
    rm -rf "$state" "$owner_file"
}

# shape TC DEVICE RATE DELAY: a token bucket (tbf) for the rate, under netem for the delay.
# tbf is in every kernel; netem is a module some kernels lack, so it is only asked for a delay.
shape() {
    local tc=$1 dev=$2 rate=$3 delay=$4 parent="root"
    if [ -n "$delay" ]; then
        $tc qdisc add dev "$dev" root handle 1: netem delay "$delay" || {
            echo "emulated_cluster: this kernel has no netem qdisc: --delay is not possible" >&2
            exit 1; }
        parent="parent 1:"
    fi
    if [ -n "$rate" ]; then
        # A burst of a few MTUs keeps the rate exact at the scale of a step; a queue of
        # 20 ms of traffic, like a switch port's, holds TCP's bursts without delaying every
        # small message behind seconds of bulk transfers. One FIFO, not fair queueing by
        # flow: the sandbox kernel this was written on has no fq, fq_codel or sfq qdisc.
        $tc qdisc add dev "$dev" $parent handle 2: tbf rate "$rate" burst 64kb latency 20ms
    fi
}

need_sshd() {
    [ -x /usr/sbin/sshd ] && return
    echo "emulated_cluster: installing openssh-server" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null
    # The package starts nothing here (no init system); the hosts run their own sshd.
}

up() {
    local count=$1; shift
    local rate="" delay=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --rate) rate=$2; shift 2 ;;
            --delay) delay=$2; shift 2 ;;
            *) usage ;;
        esac
    done
    [[ "$count" =~ ^[1-9][0-9]?$ ]] || { echo "emulated_cluster: N must be 1..99" >&2; exit 2; }
    [ "$(id -u)" = 0 ] || { echo "emulated_cluster: needs root (network namespaces)" >&2; exit 1; }
    need_sshd
    refuse_if_owned
    down
    trap '[ $? -eq 0 ] || down' EXIT  # a cluster that failed to come up is taken down whole
    mkdir -p "$state" /run/sshd
    chmod 700 "$state"
    ssh-keygen -q -t ed25519 -N "" -f "$state/id_ed25519"
    ssh-keygen -q -t ed25519 -N "" -f "$state/host_key"
    cp "$state/id_ed25519.pub" "$state/authorized_keys"

    ip link add "$bridge" type bridge
    ip addr add "$subnet.1/24" dev "$bridge"
    ip link set "$bridge" up

    : > "$state/hosts"
    : > "$state/resources"
    for i in $(seq 1 "$count"); do
        echo "h$i $subnet.$((i + 1))" >> "$state/hosts"
        echo "$subnet.$((i + 1)): 0,1" >> "$state/resources"
    done
    for i in $(seq 1 "$count"); do
        local ns=pxh$i address=$subnet.$((i + 1))
        ip netns add "$ns"
        ip link add "pxv$i" type veth peer name "pxe$i"
        ip link set "pxv$i" master "$bridge" up
        ip link set "pxe$i" netns "$ns"
        ip -n "$ns" link set "pxe$i" name eth0
        ip -n "$ns" addr add "$address/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        # Shape what the host sends, on its own interface, and what it receives, on the
        # bridge port: the host's link is limited both ways.
        shape "ip netns exec $ns tc" eth0 "$rate" "$delay"
        shape tc "pxv$i" "$rate" "$delay"
        # gloo finds a host's address by resolving its hostname: each host has its own name and
        # a hosts file (ip netns exec bind-mounts /etc/netns/NS/hosts) that knows every host.
        mkdir -p "/etc/netns/$ns"
        { echo "127.0.0.1 localhost"; echo "$subnet.1 driver";
          awk '{print $2, $1}' "$state/hosts"; } > "/etc/netns/$ns/hosts"
        cat > "$state/sshd-$i.conf" <<CONF
ListenAddress $address
HostKey $state/host_key
AuthorizedKeysFile $state/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
PidFile $state/sshd-$i.pid
UsePAM no
StrictModes no
AcceptEnv *
CONF
        ip netns exec "$ns" unshare --uts sh -c "hostname h$i; exec /usr/sbin/sshd -f '$state/sshd-$i.conf'"
    done
    cat > "$state/ssh_config" <<CONF
Host $subnet.* h*
    User root
    IdentityFile $state/id_ed25519
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
CONF
    for i in $(seq 1 "$count"); do
        local tries=0
        until ssh -F "$state/ssh_config" -o BatchMode=yes -o ConnectTimeout=2 \
                "$subnet.$((i + 1))" true 2>/dev/null; do
            tries=$((tries + 1))
            [ $tries -lt 50 ] || { echo "emulated_cluster: sshd of h$i does not answer" >&2; exit 1; }
            sleep 0.1
        done
    done
    echo "$PPID $(started "$PPID")" > "$owner_file"
    echo "$state"
}

case "${1:-}" in
    up) [ $# -ge 2 ] || usage; shift; up "$@" ;;
    down) case "${2:-}" in ""|--force) down "${2:-}" ;; *) usage ;; esac ;;
    *) usage ;;
esac
