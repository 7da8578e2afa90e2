#!/usr/bin/env bash
# A real Slurm cluster (slurmctld, slurmd, munge from Debian's slurm-wlm) on top of the emulated
# cluster of scripts/emulated_cluster.sh, for tests of a Slurm launcher. Root only.
#
#   scripts/emulated_cluster.sh up 2                # first: the hosts h1, h2
#   scripts/slurm_cluster.sh up                     # prints the slurm.conf to export as SLURM_CONF
#   SLURM_CONF=.../slurm/slurm.conf srun -N2 hostname
#   scripts/slurm_cluster.sh down                   # cancels jobs, stops the daemons; safe twice
#
# The controller runs in the root namespace as host "driver" (10.213.0.1), one slurmd per host in
# its namespace as node hN; partition "debug" holds all nodes, 2 CPUs each, shared by CPU.
# Its files go in slurm/ of the emulated cluster's state folder (PARALLAX_CLUSTER_DIR).
set -euo pipefail

state="${PARALLAX_CLUSTER_DIR:-/tmp/parallax-cluster}"
dir="$state/slurm"
conf="$dir/slurm.conf"
socket="$dir/munge.socket"
controller=10.213.0.1
export SLURM_CONF="$conf"

usage() { sed -n '2,12p' "$0" >&2; exit 2; }

need_slurm() {
    [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] && return
    echo "slurm_cluster: installing slurm-wlm and munge" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
    # The packages start nothing here (no init system); this script runs its own daemons.
}

# stop NAME PIDFILE: SIGTERM the daemon named in PIDFILE if it is still that program (a pid
# can be reused), then SIGKILL it if it has not gone after 5 s.
stop() {
    local name=$1 pidfile=$2 pid tries=0
    [ -e "$pidfile" ] || return 0
    pid=$(cat "$pidfile" 2>/dev/null) || return 0
    [[ "$pid" =~ ^[0-9]+$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || return 0
    kill "$pid" 2>/dev/null || true
    while alive "$pid" && [ $tries -lt 50 ]; do sleep 0.1; tries=$((tries + 1)); done
    kill -9 "$pid" 2>/dev/null || true
}

# alive PID: the process exists and is not a zombie (an init that reaps nothing, as in some
# containers, leaves exited daemons as zombies).
alive() { [ -e "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

# kill_tree PID: SIGKILL PID and all its descendants (children first found, then killed).
kill_tree() {
    local child
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$child"; done
    kill -9 "$1" 2>/dev/null || true
}

down() {
    [ -d "$dir" ] || return 0
    # slurmd leaves running steps alone when it stops: cancel every job while the controller
    # is there and wait for the steps to end (SIGTERM, then SIGKILL after KillWait).
    if [ -e "$dir/slurmctld.pid" ] && squeue -h >/dev/null 2>&1; then
        scancel --full $(squeue -h -o %i) 2>/dev/null || true
        local tries=0
        while [ -n "$(squeue -h -o %i 2>/dev/null)" ] && [ $tries -lt 150 ]; do
            sleep 0.1; tries=$((tries + 1))
        done
    fi
    for pidfile in "$dir"/slurmd-*.pid; do stop slurmd "$pidfile"; done
    stop slurmctld "$dir/slurmctld.pid"
    # A step whose job did not end in time would keep its slurmstepd and tasks in the host.
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^pxh[0-9]*$' || true); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmstepd ] && kill_tree "$pid"
        done
    done
    stop munged "$dir/munged.pid"
    rm -rf "$dir"
}

up() {
    [ "$(id -u)" = 0 ] || { echo "slurm_cluster: needs root (network namespaces)" >&2; exit 1; }
    [ -s "$state/hosts" ] || {
        echo "slurm_cluster: no emulated cluster in $state (scripts/emulated_cluster.sh up N)" >&2
        exit 1; }
    need_slurm
    down
    trap '[ $? -eq 0 ] || down' EXIT  # a cluster that failed to come up is taken down whole
    mkdir -p "$dir/ctld"
    chmod 700 "$dir"

    # One munged serves every host: a Unix socket is a file, reachable from any network
    # namespace. Its own key and socket keep it apart from a system munged on /run/munge.
    # --force: munged wants the socket's folder open to all users; only root uses this one.
    mungekey --create --keyfile="$dir/munge.key"
    munged --force --socket="$socket" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
        --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"
    ip netns exec pxh1 munge --socket="$socket" -n |
        unmunge --socket="$socket" >/dev/null ||
        { echo "slurm_cluster: munge does not work from the hosts" >&2; exit 1; }

    local nodes
    nodes=$(awk '{print $1}' "$state/hosts" | paste -sd,)
    {
        cat <<CONF
ClusterName=parallax
SlurmctldHost=driver($controller)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
MpiDefault=none
MailProg=/bin/true
# No cgroups (containers often cannot create them): track steps by process tree, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# Several jobs and steps share a node, one CPU each.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# Each host has 2 CPUs, like the emulated cluster's 2 slots, whatever the machine has: without
# this a machine with fewer cores would drain its nodes (Low CPUs).
SlurmdParameters=config_overrides
# A cancelled step gets SIGTERM, then SIGKILL this many seconds later (Slurm's default is 30).
KillWait=5
StateSaveLocation=$dir/ctld
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/slurmctld.log
# Every slurmd shares this filesystem: %n (the node name) keeps their files apart.
SlurmdSpoolDir=$dir/slurmd-%n
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmdLogFile=$dir/slurmd-%n.log
CONF
        while read -r name address; do
            echo "NodeName=$name NodeAddr=$address CPUs=2 State=UNKNOWN"
        done < "$state/hosts"
        echo "PartitionName=debug Nodes=$nodes Default=YES MaxTime=INFINITE State=UP"
    } > "$conf"
    # slurmd 22.05 loads a cgroup plugin even with no cgroup tracking, and its autodetection
    # fails in a host: ip netns exec mounts a fresh /sys without /sys/fs/cgroup. Naming the v1
    # plugin skips the detection; nothing here makes it touch cgroups.
    echo "CgroupPlugin=cgroup/v1" > "$dir/cgroup.conf"

    # slurmctld only runs on a host named in SlurmctldHost: give it the name "driver" in a
    # UTS namespace of its own, leaving the machine's hostname alone.
    unshare --uts sh -c "hostname driver; exec slurmctld -f '$conf'"
    local i
    while read -r name address; do
        i=${name#h}
        mkdir -p "$dir/slurmd-$name"  # slurmd does not create its spool folder
        ip netns exec "pxh$i" unshare --uts sh -c "hostname $name; exec slurmd -f '$conf' -N $name"
    done < "$state/hosts"

    local tries=0 count
    count=$(wc -l < "$state/hosts")
    until [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" = "$count" ]; do
        tries=$((tries + 1))
        [ $tries -lt 300 ] || {
            sinfo -N >&2 || true
            echo "slurm_cluster: nodes not idle after 30 s; see $dir/*.log" >&2; exit 1; }
        sleep 0.1
    done
    echo "slurm_cluster: $state ($nodes idle); use it with: export SLURM_CONF=$conf" >&2
    echo "$conf"
}

case "${1:-}" in
    up) [ $# -eq 1 ] || usage; up ;;
    down) [ $# -eq 1 ] || usage; down ;;
    *) usage ;;
esac
