#!/usr/bin/env bash
# local-cluster.sh: a real multi-node Slurm cluster on one machine, for end-to-end tests.
#
#   bash slurm/local-cluster.sh up      [DIR]          start it (idempotent); the last line of
#                                                      stdout is `export SLURM_CONF=DIR/etc/slurm.conf`
#   bash slurm/local-cluster.sh down    [--purge] [DIR] stop it (by recorded PID); --purge also
#                                                      deletes its state, database and logs
#   bash slurm/local-cluster.sh status  [DIR]          daemons, nodes and jobs; exit 0 when up
#   bash slurm/local-cluster.sh exec    [DIR] -- CMD.. run CMD with SLURM_CONF set and node names
#                                                      resolvable (private /etc/hosts)
#   bash slurm/local-cluster.sh install                install the Debian packages (`up` does it
#                                                      when they are missing)
#
#   eval "$(bash slurm/local-cluster.sh up | tail -1)"     # then: sinfo, srun -N2 hostname, ...
#
# DIR defaults to ${SLURM_LOCAL_DIR:-/tmp/slurm-local}. Everything (configuration, munge key,
# MariaDB datadir, Slurm state, spool, logs, pid files) lives under DIR; the only things outside
# it are the Debian packages (`install`).
#
# What runs (all on 127.0.0.1, all as background processes started by this script, one start_*
# function each):
#   munged      own key and socket under DIR/munge (runs as user munge)
#   mariadbd    own datadir DIR/mysql, port 7806, socket DIR/run/mysqld.sock
#   slurmdbd    port 7819, accounting for cluster "localcluster" (sacct works)
#   slurmctld   port 7817
#   slurmd x4   node1..node4 on ports 7821-7824, 2 CPUs and 4000 MB each, partition "debug"
# Each slurmd runs in its own mount + UTS namespace, with hostname nodeX and a private
# /etc/hosts (+ nsswitch.conf with `hosts: files`), so inside a job `hostname` is the node name
# and every node name resolves to 127.0.0.1 without DNS. slurmctld and slurmdbd get the same
# private hosts file. The machine's own /etc/hosts is never modified.
#
# Requires root (namespaces, bind mounts, package installation). Debian 12 / Slurm 22.05.
#
# Environment knobs (read by `up`; defaults in brackets):
#   SLURM_LOCAL_DIR [/tmp/slurm-local]    SLURM_LOCAL_NODES [4]      SLURM_LOCAL_CPUS [2]
#   SLURM_LOCAL_MEM_MB [4000]             SLURM_LOCAL_TIMEOUT [120]  (seconds to wait for `up`)
#   SLURM_LOCAL_PORT_OFFSET [0]           added to every port, to run a second cluster beside
#                                         the first (use a different DIR, offset >= 100)
#   SLURM_LOCAL_MAX_ARRAY_SIZE [1001]     slurm.conf MaxArraySize: array indices 0..N-1, at
#                                         most N tasks per array (Slurm's default is 1001)
#   SLURM_LOCAL_OVERSUBSCRIBE [YES:4]     partition OverSubscribe: YES:4 honours --exclusive
#                                         and shares cores only with jobs that ask
#                                         (--oversubscribe); FORCE:4 shares always

set -euo pipefail
export PATH="/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"
export LC_ALL=C

readonly PROG=local-cluster.sh
readonly CLUSTER=localcluster
readonly PARTITION=debug
readonly PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)

log() { printf '[%s] %s\n' "$PROG" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$PROG" "$*" >&2; exit 1; }

usage() {
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# --------------------------------------------------------------------------- arguments
CMD=${1:-}
[[ -n $CMD ]] || usage
shift
PURGE=0
DIR_ARG=
EXEC_ARGS=()
while (($#)); do
    case $1 in
        --purge) [[ $CMD == down ]] || usage; PURGE=1 ;;
        --) shift; EXEC_ARGS=("$@"); break ;;
        -h|--help) usage ;;
        -*) die "unknown option: $1" ;;
        *) [[ -z $DIR_ARG ]] || usage; DIR_ARG=$1 ;;
    esac
    shift
done

DIR=${DIR_ARG:-${SLURM_LOCAL_DIR:-/tmp/slurm-local}}
DIR=$(realpath -m -- "$DIR")
[[ $DIR != / ]] || die "refusing to use / as the cluster directory"

NODES=${SLURM_LOCAL_NODES:-4}
CPUS=${SLURM_LOCAL_CPUS:-2}
MEM_MB=${SLURM_LOCAL_MEM_MB:-4000}
TIMEOUT=${SLURM_LOCAL_TIMEOUT:-120}
OFFSET=${SLURM_LOCAL_PORT_OFFSET:-0}
MAX_ARRAY_SIZE=${SLURM_LOCAL_MAX_ARRAY_SIZE:-1001}
OVERSUBSCRIBE=${SLURM_LOCAL_OVERSUBSCRIBE:-YES:4}
for v in NODES CPUS MEM_MB TIMEOUT OFFSET MAX_ARRAY_SIZE; do
    [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer (got '${!v}')"
done
((NODES >= 1 && NODES <= 64)) || die "SLURM_LOCAL_NODES must be between 1 and 64"
((CPUS >= 1)) || die "SLURM_LOCAL_CPUS must be >= 1"
# MaxArraySize must stay below MaxJobCount (10000 by default).
((MAX_ARRAY_SIZE >= 1 && MAX_ARRAY_SIZE <= 9999)) || die "SLURM_LOCAL_MAX_ARRAY_SIZE must be between 1 and 9999"
[[ $OVERSUBSCRIBE =~ ^(NO|EXCLUSIVE|YES(:[0-9]+)?|FORCE(:[0-9]+)?)$ ]] ||
    die "SLURM_LOCAL_OVERSUBSCRIBE must be NO, EXCLUSIVE, YES[:N] or FORCE[:N] (got '$OVERSUBSCRIBE')"
((OFFSET + 7821 + NODES <= 10000)) || die "SLURM_LOCAL_PORT_OFFSET=$OFFSET puts the daemons at port 10000 or above, where jobs take their MASTER_PORT: use an offset below $((10000 - 7821 - NODES))"

# Every port stays below 10000, out of the range the benchmark's jobs take their MASTER_PORT
# from (jobs/dist.py: 10000-29999, derived from the job id), as a real cluster's daemons do.
readonly CTLD_PORT=$((7817 + OFFSET))
readonly DBD_PORT=$((7819 + OFFSET))
readonly DB_PORT=$((7806 + OFFSET))
readonly SLURMD_PORT0=$((7821 + OFFSET))

# Layout under DIR.
readonly ETC=$DIR/etc                      # slurm.conf, slurmdbd.conf
readonly CONF=$ETC/slurm.conf
readonly DBD_CONF=$ETC/slurmdbd.conf
readonly MUNGE_DIR=$DIR/munge              # key + socket (owned by user munge)
readonly MUNGE_KEY=$MUNGE_DIR/munge.key
readonly MUNGE_SOCK=$MUNGE_DIR/munge.socket
readonly NS_DIR=$DIR/ns                    # private hosts / nsswitch.conf files
readonly NSS_FILE=$NS_DIR/nsswitch.conf
readonly CTL_HOSTS=$NS_DIR/hosts
readonly RUN=$DIR/run                      # pid files written by the daemons, MariaDB socket
readonly DB_SOCK=$RUN/mysqld.sock
readonly PIDS=$DIR/pids                    # PIDs recorded by this script (what `down` kills)
readonly LOGS=$DIR/log
readonly STATE=$DIR/state                  # slurmctld StateSaveLocation
readonly SPOOL=$DIR/spool                  # slurmd spool, one directory per node
readonly DB_DATA=$DIR/mysql                # MariaDB datadir
readonly DB_TMP=$DIR/tmp
readonly MARKER=$DIR/.slurm-local-cluster  # marks DIR as ours (checked before deleting)
readonly DB_USER=slurm
readonly DB_PASS=slurm-local-cluster
readonly DB_NAME=slurm_acct_db

# Every daemon gets this variable in its environment: a process is "ours" only if
# /proc/PID/environ carries it, so a recycled PID is never signalled.
readonly OWNER_ENV="SLURM_LOCAL_CLUSTER_DIR=$DIR"

export SLURM_CONF=$CONF
# Client commands must not pick up settings of an enclosing job or user environment.
unset SLURM_CLUSTERS SLURM_JOB_ID SLURM_JOBID SQUEUE_FORMAT SQUEUE_FORMAT2 SINFO_FORMAT \
    SACCT_FORMAT SLURM_TIME_FORMAT 2>/dev/null || true

node_names() { local i; for ((i = 1; i <= NODES; i++)); do printf 'node%d\n' "$i"; done; }
node_range() { if ((NODES == 1)); then echo node1; else echo "node[1-$NODES]"; fi; }
port_range() {
    if ((NODES == 1)); then echo "$SLURMD_PORT0"; else echo "[$SLURMD_PORT0-$((SLURMD_PORT0 + NODES - 1))]"; fi
}

# --------------------------------------------------------------------------- processes
# is_ours PID: the process exists, is not a zombie, and was started by this script for DIR.
# A process in the middle of an exec (the daemons start through setsid, env, unshare/setpriv
# and bash, each exec'ing the next) shows an empty or unreadable environment for a moment:
# read it again before deciding, so a daemon on its way up is neither declared dead by `up`
# nor left running by `down`.
is_ours() {
    local pid=$1 env try
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    for ((try = 0; try < 20; try++)); do
        env=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ") || env=
        if [[ -n $env ]]; then
            grep -qxF -- "$OWNER_ENV" <<<"$env"
            return
        fi
        running "$pid" || return 1
        sleep 0.05
    done
    return 1
}

# running PID: the process exists and is not a zombie (whoever started it).
running() { [[ -r /proc/$1/stat && $(sed -E 's/.*\) (.).*/\1/' 2>/dev/null <"/proc/$1/stat") =~ ^[^ZX]$ ]]; }

pid_of() { local f=$PIDS/$1.pid; [[ -r $f ]] && cat "$f"; }
alive() { local pid; pid=$(pid_of "$1") && is_ours "$pid"; }
recorded_daemons() {
    local f
    for f in "$PIDS"/*.pid; do [[ -e $f ]] && basename "$f" .pid; done
    return 0
}

# start_daemon NAME CMD...: run CMD in its own session, detached from our stdio, with a clean
# environment; record its PID (setsid does not fork here: we are not a process-group leader).
# $! is at first a fork of this script, which becomes "ours" (is_ours: OWNER_ENV in its
# environment) only once it has exec'ed `env -i ... OWNER_ENV`. Until then `alive NAME` is
# false, and a readiness check right after the start would take a daemon on its way up for one
# that exited (a restart then failed, under load, with "munged exited while waiting for munged").
# So wait for that exec, or for the process to end.
start_daemon() {
    local name=$1 pid t; shift
    setsid env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        SLURM_CONF="$CONF" "$OWNER_ENV" "$@" \
        </dev/null >>"$LOGS/$name.out" 2>&1 9>&- &
    pid=$!
    echo "$pid" >"$PIDS/$name.pid"
    for ((t = 0; t < 3000; t++)); do # 30 s at most
        if is_ours "$pid" || ! running "$pid"; then return 0; fi
        sleep 0.01
    done
    fail "$name (pid $pid) did not start within 30s"
}

# A command prefix that runs the rest in a private mount namespace (and UTS namespace with
# hostname $2 when $2 is non-empty) where $1 is bind-mounted over /etc/hosts and our
# nsswitch.conf (hosts: files) over /etc/nsswitch.conf.
# shellcheck disable=SC2016
readonly NS_SETUP='
mount --bind "$1" /etc/hosts || exit 111
mount --bind "$2" /etc/nsswitch.conf || exit 111
if [ -n "$3" ]; then hostname "$3" || exit 111; fi
shift 3
exec "$@"'
ns_prefix() { # HOSTS_FILE HOSTNAME: sets the NS_CMD array
    local hosts=$1 host=$2
    NS_CMD=(unshare --mount)
    if [[ -n $host ]]; then NS_CMD+=(--uts); fi
    NS_CMD+=(--propagation private -- /bin/bash -c "$NS_SETUP" ns-setup "$hosts" "$NSS_FILE" "$host")
}

ns_id() { # PID -> "mnt:[...] uts:[...]"
    local m u
    m=$(readlink "/proc/$1/ns/mnt" 2>/dev/null) || return 1
    u=$(readlink "/proc/$1/ns/uts" 2>/dev/null) || return 1
    echo "$m $u"
}

# The longest stop_daemons waits after SIGTERM before SIGKILL; a failed `up` lowers it (fail).
STOP_WAIT_MAX_S=60

# stop_daemons TIMEOUT NAME...: SIGTERM each live one, wait (at most STOP_WAIT_MAX_S), then SIGKILL
# what remains.
stop_daemons() {
    local timeout=$(($1 < STOP_WAIT_MAX_S ? $1 : STOP_WAIT_MAX_S)); shift
    local name pid live=() t
    for name in "$@"; do
        if pid=$(pid_of "$name") && is_ours "$pid"; then
            kill -TERM "$pid" 2>/dev/null || true
            live+=("$name")
        fi
    done
    for ((t = 0; t < timeout * 4; t++)); do
        local still=()
        for name in "${live[@]}"; do
            if alive "$name"; then still+=("$name"); fi
        done
        live=("${still[@]}")
        ((${#live[@]})) || break
        sleep 0.25
    done
    for name in "${live[@]}"; do
        pid=$(pid_of "$name") || continue
        log "$name (pid $pid) did not exit after ${timeout}s: SIGKILL"
        if is_ours "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
    done
    for name in "${live[@]}"; do
        for ((t = 0; t < 20; t++)); do alive "$name" || break; sleep 0.1; done
    done
    for name in "$@"; do rm -f "$PIDS/$name.pid"; done
}

# Job processes (slurmstepd and the tasks under it) live in the namespaces of the slurmd that
# started them. After the slurmds are stopped, kill whatever is still in those namespaces.
# A process must match both the mount and UTS namespace recorded at start and have our private
# hosts file mounted, so an unrelated process can never be hit.
kill_node_leftovers() {
    local f ns mnt pid p node sig t pids=() host_ns
    host_ns=$(ns_id $$)
    for f in "$PIDS"/slurmd-*.ns; do
        [[ -e $f ]] || continue
        ns=$(cat "$f")
        [[ -n $ns && $ns != "$host_ns" ]] || continue
        node=$(basename "$f" .ns); node=${node#slurmd-}
        # One pass over /proc for the mount namespace, then check the few candidates.
        while read -r pid mnt; do
            [[ "$mnt $(readlink "/proc/$pid/ns/uts" 2>/dev/null)" == "$ns" ]] || continue
            grep -qF "hosts.$node /etc/hosts " "/proc/$pid/mountinfo" 2>/dev/null || continue
            pids+=("$pid")
        done < <(find /proc/[0-9]*/ns -maxdepth 1 -name mnt -printf '%h %l\n' 2>/dev/null |
            awk -v want="${ns%% *}" '$2 == want { sub("^/proc/", "", $1); sub("/ns$", "", $1); print $1, $2 }')
    done
    if ((${#pids[@]})); then
        log "killing ${#pids[@]} leftover job process(es) on the nodes: ${pids[*]}"
        for sig in TERM KILL; do
            kill "-$sig" "${pids[@]}" 2>/dev/null || true
            for ((t = 0; t < 20; t++)); do
                local left=()
                for p in "${pids[@]}"; do
                    if running "$p"; then left+=("$p"); fi
                done
                pids=("${left[@]}")
                ((${#pids[@]})) || break
                sleep 0.25
            done
            ((${#pids[@]})) || break
        done
    fi
    rm -f "$PIDS"/slurmd-*.ns
}

# --------------------------------------------------------------------------- helpers
port_busy() { (: <>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Lines every healthy start writes, left out of what `up` shows when it fails: each Slurm daemon
# checks at start that munged refuses a credential restricted to another UID, and munged logs
# the refusal ("Unauthorized credential for client UID=0 GID=0"): 6 lines per `up`, harmless.
readonly HARMLESS_LOG_LINES='Unauthorized credential for client UID=0 GID=0|mpi/pmix|MPI: Cannot create context|Couldn.t load specified plugin name for mpi/pmix'

# The daemons' logs; a daemon's .out (stdout/stderr) only where it has no log file of its own or
# that file is empty, as when it failed before opening it. munged logs to its .out (-F).
tail_logs() {
    local f log
    for f in "$LOGS"/*.log "$LOGS"/*.out; do
        [[ -s $f && $f != */mariadb-install.log ]] || continue
        if [[ $f == *.out ]]; then
            log=${f%.out}.log
            [[ $log == */mariadbd.log ]] && log=$LOGS/mariadb.log
            [[ ! -s $log ]] || continue
        fi
        printf -- '----- %s (last 15 lines) -----\n' "$f" >&2
        grep -Ev -- "$HARMLESS_LOG_LINES" "$f" | tail -n 15 >&2 || true
    done
}

UP_STARTED=0
fail() {
    printf '[%s] ERROR: %s\n' "$PROG" "$*" >&2
    tail_logs
    if ((UP_STARTED)); then
        log "stopping the daemons started so far (logs kept in $LOGS)"
        # 5 s each before SIGKILL, not up to a minute: a mariadbd that gets SIGTERM about 0.05-0.15 s
        # into its start (a deadline that passes just after it was started) finishes starting,
        # answers nothing and never exits on SIGTERM. A healthy daemon stops well within 5 s, and
        # InnoDB recovers from a SIGKILL at the next start.
        STOP_WAIT_MAX_S=5
        stop_everything 1 >/dev/null 2>&1 || true
    fi
    exit 1
}

DEADLINE=0
# wait_until DESCRIPTION CHECK_FUNCTION [DAEMON...]: poll until CHECK succeeds; fail early if
# one of the named daemons has exited, or at the deadline.
wait_until() {
    local desc=$1 check=$2 d; shift 2
    while :; do
        "$check" && return 0
        for d in "$@"; do
            alive "$d" || fail "$d exited while waiting for $desc (see $LOGS/$d.out and $LOGS/$d.log)"
        done
        ((SECONDS < DEADLINE)) || fail "timed out after ${TIMEOUT}s waiting for $desc"
        sleep 0.25
    done
}

# Commands the cluster needs, and the ones of them not installed.
readonly NEEDED_COMMANDS=(slurmctld slurmd slurmdbd sinfo sacct sacctmgr munged mungekey munge unmunge
    mariadbd mariadb-install-db mariadb mariadb-admin unshare setpriv flock)
missing_commands() {
    local b
    for b in "${NEEDED_COMMANDS[@]}"; do
        command -v "$b" >/dev/null || echo "$b"
    done
    return 0
}

# install: the Debian packages (no service is started: the package scripts find no systemd).
cmd_install() {
    [[ $(id -u) == 0 ]] || die "must run as root (package installation)"
    local missing
    missing=$(missing_commands)
    if [[ -z $missing ]]; then
        log "packages already installed (${PACKAGES[*]})"
        return 0
    fi
    log "installing ${PACKAGES[*]} (missing: $(tr '\n' ' ' <<<"$missing"))"
    command -v apt-get >/dev/null || die "apt-get not found: install ${PACKAGES[*]} yourself"
    export DEBIAN_FRONTEND=noninteractive
    local apt=(apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=600
        -o Dpkg::Options::=--force-confdef
        -o Dpkg::Options::=--force-confold "${PACKAGES[@]}")
    if ! "${apt[@]}" >&2; then
        log "install failed; running apt-get update and retrying"
        if ! apt-get -o DPkg::Lock::Timeout=600 update >&2 || ! "${apt[@]}" >&2; then
            die "package installation failed"
        fi
    fi
    missing=$(missing_commands)
    [[ -z $missing ]] || die "still missing after installing ${PACKAGES[*]}: $(tr '\n' ' ' <<<"$missing")"
    log "installed ${PACKAGES[*]}"
}

take_lock() {
    exec 9>"$DIR/.lock"
    flock -w "$TIMEOUT" 9 || die "another $PROG is working on $DIR (lock $DIR/.lock)"
}

# --------------------------------------------------------------------------- configuration
write_config() {
    local real_host node
    real_host=$(uname -n)

    # nsswitch.conf: the machine's own, with host lookups restricted to files.
    if [[ -r /etc/nsswitch.conf ]]; then
        sed -E 's/^hosts:.*/hosts:          files/' /etc/nsswitch.conf >"$NSS_FILE.tmp"
        grep -q '^hosts:' "$NSS_FILE.tmp" || echo 'hosts:          files' >>"$NSS_FILE.tmp"
    else
        printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files\n' >"$NSS_FILE.tmp"
    fi
    mv -f "$NSS_FILE.tmp" "$NSS_FILE"

    # hosts files: every node name (and the machine's own name) is 127.0.0.1, one name per
    # line so a lookup of nodeX returns nodeX as canonical name. The first line is the node's
    # own name (localhost for the controller's file): reverse lookups of 127.0.0.1, e.g.
    # socket.getfqdn(), give back the name of the node they run on.
    write_hosts() { # FILE FIRST_NAME
        local file=$1 first=$2 n
        {
            echo "# private hosts file of the local Slurm cluster in $DIR"
            echo "127.0.0.1 $first"
            for n in localhost $(node_names) "$real_host"; do
                [[ $n == "$first" ]] || echo "127.0.0.1 $n"
            done | awk '!seen[$0]++'
            echo "::1 localhost ip6-localhost ip6-loopback"
        } >"$file"
    }
    write_hosts "$CTL_HOSTS" localhost
    while read -r node; do write_hosts "$NS_DIR/hosts.$node" "$node"; done < <(node_names)

    # Job ids: a fresh cluster starts from a clock-derived id (not 1), so job ids of two fresh
    # clusters do not collide in a reused submitit folder. Kept with the state.
    [[ -s $ETC/first-job-id ]] || echo $(($(date +%s) % 50000000 + 1000000)) >"$ETC/first-job-id"

    render_slurm_conf >"$CONF.tmp"
    mv -f "$CONF.tmp" "$CONF"
    : >"$ETC/plugstack.conf"
    write_oci_conf

    (
        umask 077
        cat >"$DBD_CONF.tmp" <<EOF
# Written by slurm/local-cluster.sh on every \`up\`; edits are overwritten.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
EOF
    )
    chmod 0600 "$DBD_CONF.tmp"
    mv -f "$DBD_CONF.tmp" "$DBD_CONF"
}

# Slurm's own OCI containers (srun --container=BUNDLE, an OCI bundle directory) run through runc
# where it is installed; without oci.conf Slurm treats --container as advice and runs on the host.
# Each task's container is named node.user.job.step.task; runc keeps their state under DIR.
# Tasks start through oci-run.sh, which gives each its rank variables (Slurm 22.05 leaves them out).
write_oci_conf() {
    if ! command -v runc >/dev/null; then
        rm -f "$ETC/oci.conf"
        return
    fi
    local runc here
    runc="$(command -v runc) --root=$DIR/oci-state"
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    mkdir -p "$DIR/oci-state"
    cat >"$ETC/oci.conf.tmp" <<EOF
# Written by slurm/local-cluster.sh on every \`up\`; edits are overwritten.
RunTimeQuery="$runc state %n.%u.%j.%s.%t"
RunTimeKill="$runc kill -a %n.%u.%j.%s.%t SIGTERM"
RunTimeDelete="$runc delete --force %n.%u.%j.%s.%t"
RunTimeRun="$here/oci-run.sh $DIR/oci-state %b %n %t %n.%u.%j.%s.%t"
EOF
    mv -f "$ETC/oci.conf.tmp" "$ETC/oci.conf"
}

# slurm.conf for the knobs in effect (needs $ETC/first-job-id).
render_slurm_conf() {
    cat <<EOF
# Written by slurm/local-cluster.sh on every \`up\`; edits are overwritten.
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK,cred_expire=10
CredType=cred/munge
CommunicationParameters=NoInAddrAny
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
PlugStackConfig=$ETC/plugstack.conf

ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none

SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
EnforcePartLimits=ALL
ReturnToService=2
JobRequeue=1
KillOnBadExit=1
KillWait=5
MinJobAge=300
InactiveLimit=0
MessageTimeout=20
SlurmdTimeout=60
FirstJobId=$(cat "$ETC/first-job-id")
MaxArraySize=$MAX_ARRAY_SIZE
# Report the configured CPUs/memory below whatever the hardware has, never drain for it.
SlurmdParameters=config_overrides

AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCK

NodeName=$(node_range) NodeAddr=127.0.0.1 Port=$(port_range) CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB State=UNKNOWN
# OverSubscribe=YES:4 (SLURM_LOCAL_OVERSUBSCRIBE): jobs share a node core by core, --exclusive
# gets a node to itself, and only jobs that ask (--oversubscribe) share a core (up to 4).
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=$OVERSUBSCRIBE
EOF
}

# --------------------------------------------------------------------------- readiness checks
munge_ok() { munge -n -S "$MUNGE_SOCK" 2>/dev/null | unmunge -S "$MUNGE_SOCK" >/dev/null 2>&1; }
db_ok() { mariadb-admin --no-defaults --socket="$DB_SOCK" -uroot ping >/dev/null 2>&1; }
dbd_ok() { timeout 15 sacctmgr -n -P list cluster format=cluster >/dev/null 2>&1; }
ctld_ok() { timeout 15 scontrol ping 2>/dev/null | grep -q 'is UP'; }
# The cluster is registered with slurmdbd once slurmctld has reported its control port.
registered_ok() {
    [[ $(timeout 15 sacctmgr -n -P show cluster "$CLUSTER" format=controlport 2>/dev/null) == "$CTLD_PORT" ]] &&
        timeout 15 sacct -n -X -j 1 >/dev/null 2>&1
}
NODES_SEEN=
nodes_ok() {
    local out name state ready=0 resume=()
    out=$(timeout 15 sinfo -h -N -p "$PARTITION" -o '%N %T' 2>/dev/null) || return 1
    NODES_SEEN=$(tr '\n' ' ' <<<"$out")
    while read -r name state; do
        [[ -n $name ]] || continue
        # %T: a trailing "*" means not responding; "$" (maintenance) and "-" (planned) are
        # usable.
        case ${state%[\$-]} in
            idle | mixed | allocated | completing | planned | reserved) ready=$((ready + 1)) ;;
            # Nodes drained/down in a previous run come back clean (only when responding).
            drained | draining | down | fail | failing) resume+=("$name") ;;
        esac
    done <<<"$out"
    if ((${#resume[@]})); then
        log "resuming drained/down nodes: ${resume[*]}"
        scontrol update nodename="$(IFS=,; echo "${resume[*]}")" state=resume >/dev/null 2>&1 || true
    fi
    ((ready == NODES))
}

# --------------------------------------------------------------------------- whole cluster
expected_daemons() {
    echo munged mariadbd slurmdbd slurmctld
    node_names | sed 's/^/slurmd-/'
}

daemons_alive() {
    local d
    for d in $(expected_daemons); do alive "$d" || return 1; done
}

print_export() { echo "export SLURM_CONF=$CONF"; }

stop_everything() { # QUIET
    local quiet=${1:-0} users u
    if alive slurmctld; then
        users=$(timeout 15 squeue -h -o %u 2>/dev/null | sort -u) || users=
        if [[ -n $users ]]; then
            ((quiet)) || log "cancelling all jobs (users: ${users//$'\n'/ })"
            for u in $users; do timeout 15 scancel -u "$u" >/dev/null 2>&1 || true; done
            local t
            for ((t = 0; t < 120; t++)); do
                [[ -z $(timeout 15 squeue -h -o %i 2>/dev/null) ]] && break
                sleep 0.25
            done
        fi
    fi
    local slurmds
    slurmds=$(recorded_daemons | grep '^slurmd-' || true)
    # shellcheck disable=SC2086
    [[ -z $slurmds ]] || stop_daemons 15 $slurmds
    kill_node_leftovers
    stop_daemons 30 slurmctld
    stop_daemons 30 slurmdbd
    stop_daemons 60 mariadbd
    stop_daemons 10 munged
    # Anything else recorded (e.g. nodes of a run with more SLURM_LOCAL_NODES).
    local rest
    rest=$(recorded_daemons)
    # shellcheck disable=SC2086
    [[ -z $rest ]] || stop_daemons 15 $rest
    rm -f "$MUNGE_SOCK" "$MUNGE_SOCK.lock" "$DB_SOCK" "$DB_SOCK.lock" "$RUN"/*.pid "$MUNGE_DIR/munged.pid"
}

# --------------------------------------------------------------------------- daemons
# One start function per daemon. Each starts its daemon in the background (recorded in PIDS)
# and returns once it answers; on failure it ends the script through `fail`, which stops what
# was started.

# munged: own key (made once, kept with the state), socket, pid and seed files; runs as user
# munge, in the foreground (-F), so its log is its stderr: LOGS/munged.out.
start_munged() {
    chown munge:munge "$MUNGE_DIR"
    chmod 0755 "$MUNGE_DIR"
    if [[ ! -s $MUNGE_KEY ]]; then
        mungekey --create --keyfile="$MUNGE_KEY" || fail "mungekey failed"
    fi
    chown munge:munge "$MUNGE_KEY" "$MUNGE_DIR"/munged.seed 2>/dev/null || true
    chmod 0600 "$MUNGE_KEY"
    setpriv --reuid=munge --regid=munge --init-groups test -r "$MUNGE_KEY" ||
        fail "user munge cannot reach $MUNGE_KEY: every parent directory of $DIR must be searchable by others"
    start_daemon munged setpriv --reuid=munge --regid=munge --init-groups \
        munged -F --key-file="$MUNGE_KEY" --socket="$MUNGE_SOCK" --pid-file="$MUNGE_DIR/munged.pid" \
        --seed-file="$MUNGE_DIR/munged.seed" --origin=127.0.0.1
    wait_until "munged" munge_ok munged
}

# MariaDB: own datadir (initialised once), TCP on 127.0.0.1 only; the accounting database and
# its user.
start_mariadbd() {
    if [[ ! -d $DB_DATA/mysql ]]; then
        log "initialising MariaDB datadir $DB_DATA"
        rm -rf "$DB_DATA"
        mariadb-install-db --no-defaults --datadir="$DB_DATA" --user=root \
            --auth-root-authentication-method=socket --skip-test-db --skip-name-resolve \
            --innodb-log-file-size=16M >>"$LOGS/mariadb-install.log" 2>&1 ||
            fail "mariadb-install-db failed (see $LOGS/mariadb-install.log)"
    fi
    start_daemon mariadbd mariadbd --no-defaults --user=root --datadir="$DB_DATA" \
        --socket="$DB_SOCK" --pid-file="$RUN/mariadbd.pid" --port="$DB_PORT" --bind-address=127.0.0.1 \
        --skip-name-resolve --log-error="$LOGS/mariadb.log" --tmpdir="$DB_TMP" \
        --innodb-buffer-pool-size=64M --innodb-log-file-size=16M --innodb-lock-wait-timeout=900 \
        --performance-schema=OFF --max-connections=64 --skip-log-bin
    wait_until "MariaDB" db_ok mariadbd
    mariadb --no-defaults --socket="$DB_SOCK" -uroot >>"$LOGS/mariadb-setup.log" 2>&1 <<EOF ||
CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'127.0.0.1';
EOF
        fail "could not create the accounting database user (see $LOGS/mariadb-setup.log)"
}

# slurmdbd (needs munged and MariaDB), then the cluster record, so slurmctld registers at start.
start_slurmdbd() {
    ns_prefix "$CTL_HOSTS" ""
    start_daemon slurmdbd "${NS_CMD[@]}" slurmdbd -D
    wait_until "slurmdbd" dbd_ok slurmdbd munged mariadbd
    if [[ -z $(timeout 15 sacctmgr -n -P list cluster "$CLUSTER" format=cluster 2>/dev/null) ]]; then
        timeout 30 sacctmgr -i add cluster "$CLUSTER" >>"$LOGS/sacctmgr.log" 2>&1 ||
            fail "sacctmgr add cluster $CLUSTER failed (see $LOGS/sacctmgr.log)"
    fi
}

start_slurmctld() {
    ns_prefix "$CTL_HOSTS" ""
    start_daemon slurmctld "${NS_CMD[@]}" slurmctld -D -i -f "$CONF"
    wait_until "slurmctld" ctld_ok slurmctld slurmdbd munged
}

# start_slurmd NODE: one node's slurmd in its own mount + UTS namespace (hostname NODE), whose
# namespaces are recorded for `down` to find job processes left behind. Readiness of the nodes
# is checked for all of them together (nodes_ok), after the last one is started.
start_slurmd() {
    local node=$1 host_ns pid ns
    ns_prefix "$NS_DIR/hosts.$node" "$node"
    start_daemon "slurmd-$node" "${NS_CMD[@]}" slurmd -D -N "$node" -f "$CONF"
    host_ns=$(ns_id $$)
    while :; do
        pid=$(pid_of "slurmd-$node")
        ns=$(ns_id "$pid" 2>/dev/null) || ns=
        if [[ -n $ns && $ns != "$host_ns" ]]; then echo "$ns" >"$PIDS/slurmd-$node.ns"; break; fi
        alive "slurmd-$node" || fail "slurmd-$node exited at start (see $LOGS/slurmd-$node.out)"
        ((SECONDS < DEADLINE)) || fail "timed out waiting for slurmd-$node to enter its namespace"
        sleep 0.05
    done
}

# --------------------------------------------------------------------------- subcommands
# DIR may hold only what a failed or killed `up` leaves before the marker (the lock).
dir_is_ours_or_empty() {
    [[ -e $MARKER ]] && return 0
    local f
    for f in "$DIR"/* "$DIR"/.*; do
        [[ -e $f ]] || continue
        case ${f##*/} in . | .. | .lock) ;; *) return 1 ;; esac
    done
    return 0
}

cmd_up() {
    [[ $(id -u) == 0 ]] || die "must run as root (namespaces, bind mounts, packages)"
    local t0=$SECONDS
    if [[ -n $(missing_commands) ]]; then cmd_install; fi
    mkdir -p "$DIR"
    dir_is_ours_or_empty || die "$DIR exists, is not empty and was not made by $PROG: choose another DIR"
    touch "$MARKER"
    take_lock
    DEADLINE=$((SECONDS + TIMEOUT))

    local all
    all=$(expected_daemons | tr '\n' ' ')
    if daemons_alive && ctld_ok; then
        # shellcheck disable=SC2086
        wait_until "$NODES nodes idle in partition $PARTITION" nodes_ok $all
        # shellcheck disable=SC2086
        wait_until "cluster $CLUSTER registered with slurmdbd (sacct)" registered_ok $all
        if [[ -s $ETC/first-job-id ]] && ! render_slurm_conf | cmp -s - "$CONF"; then
            log "note: the running cluster was configured differently (other SLURM_LOCAL_* knobs" \
                "or another version of $PROG); it keeps its configuration until down + up"
        fi
        log "already up ($DIR): nodes ${NODES_SEEN}"
        print_export
        return 0
    fi
    if [[ -n $(recorded_daemons) ]]; then
        log "partially up or stale ($DIR): restarting all daemons (state kept)"
        stop_everything
    fi

    local p
    for p in "$CTLD_PORT" "$DBD_PORT" "$DB_PORT" $(seq "$SLURMD_PORT0" $((SLURMD_PORT0 + NODES - 1))); do
        if port_busy "$p"; then
            die "port $p on 127.0.0.1 is already in use: stop that service, or set SLURM_LOCAL_PORT_OFFSET"
        fi
    done

    mkdir -p "$ETC" "$MUNGE_DIR" "$NS_DIR" "$RUN" "$PIDS" "$LOGS" "$STATE" "$SPOOL" "$DB_TMP"
    chmod 0755 "$DIR" "$ETC" "$RUN" "$LOGS"
    chmod 0700 "$PIDS" "$STATE"
    local node
    while read -r node; do mkdir -p "$SPOOL/$node"; done < <(node_names)
    write_config
    UP_STARTED=1

    start_munged
    start_mariadbd
    start_slurmdbd
    start_slurmctld
    while read -r node; do start_slurmd "$node"; done < <(node_names)

    # shellcheck disable=SC2086
    wait_until "$NODES nodes idle in partition $PARTITION" nodes_ok $all
    # shellcheck disable=SC2086
    wait_until "cluster $CLUSTER registered with slurmdbd (sacct)" registered_ok $all

    log "up in $((SECONDS - t0))s: cluster $CLUSTER, partition $PARTITION, nodes ${NODES_SEEN}"
    log "$NODES nodes x $CPUS CPUs, ${MEM_MB} MB each, MaxArraySize=$MAX_ARRAY_SIZE," \
        "OverSubscribe=$OVERSUBSCRIBE; logs in $LOGS"
    print_export
}

cmd_down() {
    [[ $(id -u) == 0 ]] || die "must run as root"
    if [[ ! -e $MARKER ]]; then
        log "nothing to stop: $DIR is not a local cluster directory"
        return 0
    fi
    take_lock
    local t0=$SECONDS
    if [[ -z $(recorded_daemons) ]]; then
        log "not running ($DIR)"
    else
        log "stopping the cluster in $DIR"
        stop_everything
        log "stopped in $((SECONDS - t0))s"
    fi
    if ((PURGE)); then
        rm -rf "$ETC" "$MUNGE_DIR" "$NS_DIR" "$RUN" "$PIDS" "$LOGS" "$STATE" "$SPOOL" "$DB_DATA" "$DB_TMP" "$DIR/oci-state"
        rm -f "$MARKER" "$DIR/.lock"
        rmdir "$DIR" 2>/dev/null || true
        log "purged $DIR (state, accounting database, logs)"
    fi
}

cmd_status() {
    if [[ ! -e $MARKER ]]; then
        echo "no local cluster in $DIR"
        return 3
    fi
    local d pid running=0 total=0
    echo "cluster directory: $DIR"
    echo "SLURM_CONF=$CONF"
    for d in $(recorded_daemons); do
        total=$((total + 1))
        pid=$(pid_of "$d")
        if is_ours "$pid"; then
            running=$((running + 1)); printf '  %-16s running (pid %s)\n' "$d" "$pid"
        else
            printf '  %-16s NOT running (recorded pid %s)\n' "$d" "$pid"
        fi
    done
    ((total)) || echo "  no daemons recorded (down)"
    if alive slurmctld && ctld_ok; then
        timeout 15 sinfo -N -o '%N %P %T %c %m' || true
        timeout 15 squeue || true
    fi
    if ((total == 0)); then return 3; fi
    if ((running < total)); then return 1; fi
    return 0
}

cmd_exec() {
    ((${#EXEC_ARGS[@]})) || die "usage: $PROG exec [DIR] -- COMMAND [ARGS...]"
    [[ -r $CTL_HOSTS && -r $NSS_FILE ]] || die "no local cluster configured in $DIR (run: $PROG up)"
    [[ $(id -u) == 0 ]] || die "must run as root (private mount namespace)"
    exec unshare --mount --propagation private -- /bin/bash -c "$NS_SETUP" ns-setup \
        "$CTL_HOSTS" "$NSS_FILE" "" "${EXEC_ARGS[@]}"
}

case $CMD in
    install) cmd_install ;;
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    exec) cmd_exec ;;
    *) usage ;;
esac
