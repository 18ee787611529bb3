#!/usr/bin/env bash
# Linux network namespaces as the demos' and tests' own test hosts: one
# namespace per node on a private bridge, so a node can be cut off from the
# others (and healed) by taking its link down. Needs root and iproute2.
# Only addresses inside these namespaces are ever used.
#
#   netns.sh up TAG N      creates N hosts 10.77.<x>.1..N (+ the bridge at .254);
#                          exits 3 if that subnet or bridge is already in use
#   netns.sh cut TAG I     isolates host I       netns.sh heal TAG I
#   netns.sh down TAG N    removes everything TAG created
#
# Finer faults for the fault harness (tests/chaos); nftables for drops, tc for netem and tbf:
#   netns.sh drop TAG I J [J...]   host I stops receiving packets from hosts J (one
#                                  way; drop both ways for a symmetric cut)
#   netns.sh undrop TAG I          host I receives from everyone again
#   netns.sh netem TAG I SPEC...   tc netem on host I's egress (e.g. delay 50ms 20ms loss 5%)
#   netns.sh unnetem TAG I         removes it
#   netns.sh degrade TAG I [loss P%] [rate R]
#                                  what works without netem: host I loses P% of the
#                                  packets it sends and receives on eth0 (nftables'
#                                  random numbers), and its link runs at R each way
#                                  (tbf on both ends of its veth, queueing up to 400 ms)
#   netns.sh undegrade TAG I       removes both
#   netns.sh heal-all TAG N        hosts 1..N: links up, no drops, no netem, no degrade
set -euo pipefail
cmd=$1 tag=$2 arg=$3
subnet=10.77.$(( $(printf '%d' "0x$(printf '%s' "$tag" | md5sum | cut -c1-2)") % 250 + 1 ))
br=stbr-$tag

case "$cmd" in
  up)
    # A subnet already on some interface (another TAG hashing alike) would
    # send this host's traffic to someone else's namespaces: refuse it.
    if ip -br addr | grep -q " $subnet\." || ip link show "$br" >/dev/null 2>&1; then
      echo "netns.sh: subnet $subnet or bridge $br already in use" >&2
      exit 3
    fi
    ip link add "$br" type bridge
    ip addr add "$subnet.254/24" dev "$br"
    ip link set "$br" up
    for i in $(seq 1 "$arg"); do
      ns=strom-$tag-$i
      ip netns add "$ns"
      ip link add "sv$tag$i" type veth peer name eth0 netns "$ns"
      ip link set "sv$tag$i" master "$br" up
      ip -n "$ns" addr add "$subnet.$i/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
    done
    echo "$subnet"
    ;;
  cut) ip link set "sv$tag$arg" down ;;
  heal) ip link set "sv$tag$arg" up ;;
  down)
    for i in $(seq 1 "$arg"); do
      ip netns pids "strom-$tag-$i" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
      ip link del "sv$tag$i" 2>/dev/null || true
      ip netns del "strom-$tag-$i" 2>/dev/null || true
    done
    ip link del "$br" 2>/dev/null || true
    ;;
  drop)
    shift 3
    [ $# -gt 0 ] || { echo "usage: netns.sh drop TAG I J [J...]" >&2; exit 2; }
    rules="add table inet strom_chaos
add chain inet strom_chaos input { type filter hook input priority 0; policy accept; }"
    for j in "$@"; do rules="$rules
add rule inet strom_chaos input ip saddr $subnet.$j drop"; done
    printf '%s\n' "$rules" | ip netns exec "strom-$tag-$arg" nft -f -
    ;;
  undrop)
    if ip netns exec "strom-$tag-$arg" nft list table inet strom_chaos >/dev/null 2>&1; then
      ip netns exec "strom-$tag-$arg" nft delete table inet strom_chaos
    fi
    ;;
  netem)
    shift 3
    ip netns exec "strom-$tag-$arg" tc qdisc replace dev eth0 root netem "$@"
    ;;
  unnetem) ip netns exec "strom-$tag-$arg" tc qdisc del dev eth0 root 2>/dev/null || true ;;
  degrade)
    shift 3
    loss="" rate=""
    while [ $# -gt 0 ]; do
      case "$1" in
        loss) loss=${2%\%}; shift 2 ;;
        rate) rate=$2; shift 2 ;;
        *) echo "netns.sh degrade: unknown '$1' (loss P% | rate R)" >&2; exit 2 ;;
      esac
    done
    if [ -n "$loss" ]; then
      chance="numgen random mod 100 < $loss"
      [ "$loss" -lt 100 ] || chance=""  # (nft's range for it ends at 99)
      printf '%s\n' "add table inet strom_degrade" \
        "add chain inet strom_degrade input { type filter hook input priority -1; policy accept; }" \
        "add chain inet strom_degrade output { type filter hook output priority -1; policy accept; }" \
        "add rule inet strom_degrade input iifname eth0 $chance drop" \
        "add rule inet strom_degrade output oifname eth0 $chance drop" \
        | ip netns exec "strom-$tag-$arg" nft -f -
    fi
    if [ -n "$rate" ]; then
      ip netns exec "strom-$tag-$arg" tc qdisc replace dev eth0 root tbf rate "$rate" burst 32kbit latency 400ms
      tc qdisc replace dev "sv$tag$arg" root tbf rate "$rate" burst 32kbit latency 400ms
    fi
    ;;
  undegrade)
    if ip netns exec "strom-$tag-$arg" nft list table inet strom_degrade >/dev/null 2>&1; then
      ip netns exec "strom-$tag-$arg" nft delete table inet strom_degrade
    fi
    ip netns exec "strom-$tag-$arg" tc qdisc del dev eth0 root 2>/dev/null || true
    tc qdisc del dev "sv$tag$arg" root 2>/dev/null || true
    ;;
  heal-all)
    for i in $(seq 1 "$arg"); do
      ip link set "sv$tag$i" up
      tc qdisc del dev "sv$tag$i" root 2>/dev/null || true
      if command -v nft >/dev/null && ip netns exec "strom-$tag-$i" nft list table inet strom_degrade >/dev/null 2>&1; then
        ip netns exec "strom-$tag-$i" nft delete table inet strom_degrade
      fi
      if command -v nft >/dev/null && ip netns exec "strom-$tag-$i" nft list table inet strom_chaos >/dev/null 2>&1; then
        ip netns exec "strom-$tag-$i" nft delete table inet strom_chaos
      fi
      ip netns exec "strom-$tag-$i" tc qdisc del dev eth0 root 2>/dev/null || true
    done
    ;;
  *) echo "usage: netns.sh up|cut|heal|down|drop|undrop|netem|unnetem|degrade|undegrade|heal-all TAG N|I [...]" >&2; exit 2 ;;
esac
