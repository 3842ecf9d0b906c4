# Shell helpers for the Brick judge VMs (busybox sh). Loaded by /init and
# by every command the host runs through the agent.

# Kernel command-line parameter brick.NAME=VALUE.
param() {
    for word in $(cat /proc/cmdline); do
        case "$word" in brick.$1=*) echo "${word#brick.$1=}"; return 0;; esac
    done
    return 1
}

uptime_s() { cut -d' ' -f1 /proc/uptime; }

log() { echo "[$(uptime_s)] $*"; }

die() { echo "FAIL: $*" >&2; exit 1; }

# brick.net=eth0:10.77.0.2/24,eth1:10.78.0.2/24 brick.mtu=1500
boot_setup() {
    echo 4 > /proc/sys/kernel/printk
    modprobe virtio_pci
    modprobe virtio_net
    modprobe crc32_generic
    modprobe crc32-pclmul 2>/dev/null
    modprobe rdma_rxe
    modprobe configfs && mount -t configfs none /sys/kernel/config
    mtu=$(param mtu || echo 1500)
    ip link set lo up
    index=0
    for spec in $(param net | tr ',' ' '); do
        dev=${spec%%:*}
        addr=${spec#*:}
        echo 1 > /proc/sys/net/ipv6/conf/$dev/disable_ipv6 2>/dev/null
        ip link set $dev mtu $mtu up || echo "BOOT: cannot bring up $dev"
        ip addr add $addr dev $dev
        rdma link add rxe$index type rxe netdev $dev || echo "BOOT: rdma link add rxe$index failed"
        index=$((index + 1))
    done
    log "BOOT: network and rxe up: $(param net)"
}

# Waits until $1 exists (up to $2 seconds, default 10).
wait_for() {
    n=0
    while [ ! -e "$1" ]; do
        n=$((n + 1))
        [ $n -gt $(( ${2:-10} * 10 )) ] && return 1
        sleep 0.1
    done
}

# Waits until a peer answers ICMP echo or ARP (up to 10 s). The cases do
# not call it before mapping: a first map must work with no earlier traffic.
wait_peer() {
    dev=$(ip route get "$1" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p')
    n=0
    until ping -c1 -W1 "$1" >/dev/null 2>&1 || arping -q -c1 -w1 -I "${dev:-eth0}" "$1" >/dev/null 2>&1; do
        n=$((n + 1)); [ $n -ge 10 ] && die "peer $1 answers neither ping nor arping"
    done
}

# --- RNBD client -----------------------------------------------------------

rnbd_ctl=/sys/devices/virtual/rnbd-client/ctl

# map SESSION DEVICE_PATH "PATHS" [ro] -> prints the new block device name.
# PATHS: space-separated target addresses, e.g. "10.77.0.1 10.78.0.1".
map() {
    modprobe rnbd-client || die "modprobe rnbd-client"
    sess=$1; dev=$2; paths=""
    for p in $3; do paths="$paths path=ip:$p"; done
    mode=""; [ "$4" = ro ] && mode=" access_mode=ro"
    before=$(ls /sys/block | grep '^rnbd' | sort)
    echo "sessname=$sess$paths device_path=$dev$mode" > $rnbd_ctl/map_device || die "map_device $dev refused"
    n=0
    while :; do
        new=$(ls /sys/block | grep '^rnbd' | sort)
        for d in $new; do
            echo "$before" | grep -qx "$d" || { wait_for /dev/$d 5; echo $d; return 0; }
        done
        n=$((n + 1)); [ $n -ge 100 ] && die "no rnbd device appeared for $dev"
        sleep 0.1
    done
}

# unmap DEVICE (rnbd0)
unmap() {
    echo normal > /sys/block/$1/rnbd/unmap_device || die "unmap $1"
    n=0
    while [ -e /sys/block/$1 ]; do
        n=$((n + 1)); [ $n -ge 100 ] && die "$1 still present after unmap"
        sleep 0.1
    done
}

# Size of a block device in bytes.
dev_bytes() { echo $(( $(cat /sys/block/$1/size) * 512 )); }

# rtrs-client path states for a session: "ADDR STATE" per line.
path_states() {
    for p in /sys/class/rtrs-client/$1/paths/*; do
        [ -d "$p" ] || continue
        echo "$(basename $p) $(cat $p/state)"
    done
}

# --- fio -----------------------------------------------------------------

# verify DEVICE BS SIZE [extra fio args]: random write then verify.
verify() {
    dev=$1; bs=$2; size=$3; shift 3
    fio --name=verify --filename=/dev/$dev --direct=1 --ioengine=libaio \
        --rw=randwrite --bs=$bs --size=$size --iodepth=8 --verify=crc32c \
        --verify_fatal=1 --do_verify=1 --randrepeat=0 --norandommap=0 \
        --output-format=terse --terse-version=3 "$@" > /tmp/fio.$dev.out 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then cat /tmp/fio.$dev.out; die "fio verify on $dev bs=$bs size=$size (rc $rc)"; fi
    err=$(cut -d';' -f5 /tmp/fio.$dev.out | head -1)
    [ "$err" = 0 ] || { cat /tmp/fio.$dev.out; die "fio reported error $err on $dev"; }
    log "verify $dev bs=$bs size=$size ok"
}

# durable_writer DEVICE MAX: writes block i (a 4 KiB record naming i) with
# O_DIRECT + fsync, logs each acknowledged i to /tmp/acked and each failed
# attempt to /tmp/failed (then retries the same block), until
# /tmp/writer.stop exists or MAX blocks are written.
durable_writer() {
    i=0; : > /tmp/acked; : > /tmp/failed
    while [ ! -e /tmp/writer.stop ] && [ $i -lt $2 ]; do
        { printf 'brick-durable-%08d\n' $i; head -c 4073 /dev/zero; } > /tmp/block
        if dd if=/tmp/block of=/dev/$1 bs=4096 seek=$i count=1 oflag=direct conv=notrunc,fsync 2>/dev/null; then
            echo $i >> /tmp/acked; i=$((i + 1))
        else
            echo $i >> /tmp/failed; sleep 0.5
        fi
    done
    log "writer: $(wc -l < /tmp/acked) acknowledged, $(wc -l < /tmp/failed) failed attempts"
}

# check_acked DEVICE: every block durable_writer acknowledged reads back.
check_acked() {
    n=$(wc -l < /tmp/acked)
    [ $n -gt 0 ] || die "no acknowledged writes to check"
    dd if=/dev/$1 of=/tmp/readback bs=4096 count=$n iflag=direct 2>/dev/null || die "read back $1"
    bad=0
    for i in $(cat /tmp/acked); do
        got=$(dd if=/tmp/readback bs=4096 skip=$i count=1 2>/dev/null | head -c 22)
        if [ "$got" != "$(printf 'brick-durable-%08d' $i)" ]; then
            bad=$((bad + 1)); [ $bad -le 5 ] && log "block $i reads '$got'"
        fi
    done
    [ $bad = 0 ] || die "$bad of $n acknowledged writes lost"
    log "all $n acknowledged writes read back"
}

# --- filesystems ------------------------------------------------------------

# Loads ext4 from the ext4 overlay (its modules are not in the base's
# modules.dep: insmod in the overlay's load order; already loaded is fine).
load_ext4() {
    grep -qw ext4 /proc/filesystems && return 0
    [ -f /lib/brick/ext4.modules ] || die "no ext4 overlay in this VM"
    for m in $(cat /lib/brick/ext4.modules); do
        insmod /lib/modules/$(uname -r)/$m 2>/dev/null
    done
    grep -qw ext4 /proc/filesystems || die "ext4 did not load: $(cat /lib/brick/ext4.modules | tr '\n' ' ')"
}

# Runs a command in the background; bgwait NAME collects its status.
bg() { name=$1; shift; ( "$@" > /tmp/bg.$name.out 2>&1; echo $? > /tmp/bg.$name.rc ) & }
bgwait() {
    n=0
    while [ ! -e /tmp/bg.$1.rc ]; do
        n=$((n + 1)); [ $n -ge $(( ${2:-600} * 10 )) ] && die "background job $1 did not finish"
        sleep 0.1
    done
    cat /tmp/bg.$1.out
    rc=$(cat /tmp/bg.$1.rc); rm -f /tmp/bg.$1.rc
    return $rc
}

# --- reference targets ----------------------------------------------------

# Linux rnbd_server exporting brd RAM disks (/dev/ram0..N-1, MIB each).
serve_rnbd() {
    modprobe brd rd_nr=${1:-3} rd_size=$(( ${2:-64} * 1024 )) || die "modprobe brd"
    modprobe rnbd-server dev_search_path=/dev || die "modprobe rnbd-server"
    log "rnbd_server up (port 1234)"
}

# brick-target on this VM's rxe devices (brick-verbs): N links ibv:rxe0..,
# the manifest at /etc/brick/target.toml; waits until it listens.
serve_brick() {
    links=""; i=0
    while [ $i -lt ${1:-1} ]; do links="$links --link ibv:rxe$i"; i=$((i + 1)); done
    modprobe rdma_ucm || die "modprobe rdma_ucm"
    modprobe virtio_blk 2>/dev/null
    n=0; while [ ! -b /dev/vda ] && [ $n -lt 50 ]; do n=$((n + 1)); sleep 0.2; done
    brick-target --manifest /etc/brick/target.toml $links > /tmp/brick-target.log 2>&1 &
    echo $! > /tmp/brick-target.pid
    n=0
    until grep -qs "listening on RDMA CM port" /tmp/brick-target.log; do
        if ! kill -0 "$(cat /tmp/brick-target.pid)" 2>/dev/null; then
            cat /tmp/brick-target.log; die "brick-target exited"
        fi
        n=$((n + 1))
        [ $n -le 60 ] || { cat /tmp/brick-target.log; die "brick-target did not listen in 60 s"; }
        sleep 1
    done
    cat /tmp/brick-target.log
    log "brick-target up on$links"
}

# nvmet-rdma exporting DEVICE as NQN on ADDR:4420.
serve_nvmet() {
    dev=$1; nqn=$2; addr=$3
    modprobe nvmet-rdma || die "modprobe nvmet-rdma"
    cfg=/sys/kernel/config/nvmet
    mkdir $cfg/subsystems/$nqn
    echo 1 > $cfg/subsystems/$nqn/attr_allow_any_host
    mkdir $cfg/subsystems/$nqn/namespaces/1
    echo -n $dev > $cfg/subsystems/$nqn/namespaces/1/device_path
    echo 1 > $cfg/subsystems/$nqn/namespaces/1/enable
    port=$cfg/ports/$(ls $cfg/ports | wc -l | tr -d ' ')
    mkdir $port
    echo rdma > $port/addr_trtype
    echo ipv4 > $port/addr_adrfam
    echo $addr > $port/addr_traddr
    echo 4420 > $port/addr_trsvcid
    ln -s $cfg/subsystems/$nqn $port/subsystems/$nqn || die "nvmet port link"
    log "nvmet-rdma up: $nqn at $addr:4420"
}

# --- NVMe-oF initiator ----------------------------------------------------

# nvme_connect ADDR NQN -> prints the new namespace block device.
nvme_connect() {
    modprobe nvme-rdma || die "modprobe nvme-rdma"
    before=$(ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | sort)
    echo "transport=rdma,traddr=$1,trsvcid=4420,nqn=$2" > /dev/nvme-fabrics || die "nvme connect $1 $2"
    n=0
    while :; do
        for d in $(ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | sort); do
            echo "$before" | grep -qx "$d" || { wait_for /dev/$d 5; echo $d; return 0; }
        done
        n=$((n + 1)); [ $n -ge 200 ] && die "no nvme namespace appeared"
        sleep 0.1
    done
}

# nvme_disconnect NAMESPACE (nvme0n1)
nvme_disconnect() {
    ctrl=${1%n*}
    echo 1 > /sys/class/nvme/$ctrl/delete_controller || die "delete $ctrl"
}

# reconnect_all SESSION [force]: kicks a reconnect through sysfs on every
# path that is not connected (every path with "force": after a target
# restart the client may not have noticed yet) and waits until all paths
# are connected; skips RTRS's ~30 s reconnect delay.
reconnect_all() {
    for p in /sys/class/rtrs-client/$1/paths/*; do
        if [ "$2" = force ] || ! grep -qx connected $p/state; then
            echo 1 > $p/reconnect 2>/dev/null
        fi
    done
    n=0
    until [ -n "$(path_states $1)" ] && ! path_states $1 | grep -vq ' connected$'; do
        for p in /sys/class/rtrs-client/$1/paths/*; do
            grep -qx connected $p/state || echo 1 > $p/reconnect 2>/dev/null
        done
        n=$((n + 1)); [ $n -ge 120 ] && die "paths of $1 not reconnected: $(path_states $1)"
        sleep 1
    done
    log "paths of $1: $(path_states $1 | tr '\n' ' ')"
}

# wait_connected SESSION SECONDS: waits (without kicking) until every path
# is connected again; prints how long it took.
wait_connected() {
    t0=$(uptime_s)
    n=0
    # First the client must notice the loss, then come back.
    until [ -n "$(path_states $1)" ] && ! path_states $1 | grep -vq ' connected$'; do
        n=$((n + 1)); [ $n -ge $2 ] && die "paths of $1 not reconnected after $2 s: $(path_states $1)"
        sleep 1
    done
    echo "$t0 $(uptime_s)" | awk '{print $2-$1}'
}
