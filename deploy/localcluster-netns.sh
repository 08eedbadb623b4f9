# Network-namespace mode of deploy/localcluster.sh (B300_NETNS=1); sourced by it, which
# defines CLUSTER_NAME, NETNS_NET, ALL_NODES, log/die/need_root and the process helpers.
# Layout: bridge b3br<k> in the root namespace holds the login node's address
# 10.213.<k>.1; node gpuNN is namespace b300-<cluster>-gpuNN with eth0 at 10.213.<k>.(10+NN),
# the other end of its veth pair (b3v<k>n<NN>) a port of the bridge. Faults are made
# with link state (power-off) and an nftables table of the bridge family (partition,
# login-link, loss): dropping a frame at the bridge gives no sender an error, the way
# a dead host or a cut cable gives none.

readonly NET_PREFIX=10.213.$NETNS_NET
readonly LOGIN_ADDR=$NET_PREFIX.1
readonly BRIDGE=b3br$NETNS_NET
readonly NFT_TABLE=b300_$CLUSTER_NAME

node_nn() { echo $((10#${1#gpu})); }
node_addr() { echo "$NET_PREFIX.$((10 + $(node_nn "$1")))"; }
node_ns() { echo "b300-$CLUSTER_NAME-$1"; }
node_veth() { printf 'b3v%sn%02d' "$NETNS_NET" "$(node_nn "$1")"; }
mac_of_octet() { printf '02:b3:00:%02x:00:%02x' "$NETNS_NET" "$1"; }
node_mac() { mac_of_octet $((10 + $(node_nn "$1"))); }

in_node_ns() { # node cmd...: run cmd in the node's network namespace only (no new mount namespace)
  local node=$1
  shift
  nsenter --net="/run/netns/$(node_ns "$node")" "$@"
}

need_netns() { ((NETNS)) || die "$1 needs the network-namespace mode (B300_NETNS=1)"; }

netns_exists() { [[ -e /run/netns/$1 ]]; }

_nft_ruleset() { # the table: per node a loss chain (every direction) and a cut chain (login only)
  local n v
  echo "table bridge $NFT_TABLE {"
  echo "  chain login_cut { }"
  for n in "${ALL_NODES[@]}"; do echo "  chain loss_$n { }"; echo "  chain cut_$n { }"; done
  echo "  chain from_bridge { type filter hook input priority 0; policy accept;"
  echo "    jump login_cut"
  for n in "${ALL_NODES[@]}"; do
    v=$(node_veth "$n")
    echo "    iifname \"$v\" jump cut_$n"
    echo "    iifname \"$v\" jump loss_$n"
  done
  echo "  }"
  echo "  chain to_bridge { type filter hook output priority 0; policy accept;"
  echo "    jump login_cut"
  for n in "${ALL_NODES[@]}"; do
    v=$(node_veth "$n")
    echo "    oifname \"$v\" jump cut_$n"
    echo "    oifname \"$v\" jump loss_$n"
  done
  echo "  }"
  echo "  chain between { type filter hook forward priority 0; policy accept;"
  for n in "${ALL_NODES[@]}"; do
    v=$(node_veth "$n")
    echo "    iifname \"$v\" jump loss_$n"
    echo "    oifname \"$v\" jump loss_$n"
  done
  echo "  }"
  echo "}"
}

netns_setup() { # idempotent: bridge, namespaces, veth pairs, static neighbours, nftables
  command -v nft >/dev/null || die "B300_NETNS=1 needs nftables (apt-get install nftables)"
  local owner other n ns v m a
  if [[ -e /sys/class/net/$BRIDGE ]]; then
    owner=$(cat "/sys/class/net/$BRIDGE/ifalias" 2>/dev/null || true)
    [[ -z $owner || $owner == "b300 $CLUSTER_NAME" ]] ||
      die "bridge $BRIDGE belongs to '$owner': choose another B300_NETNS_NET"
  else
    ip link add "$BRIDGE" type bridge || die "cannot create bridge $BRIDGE"
  fi
  other=$(ip -o -4 addr show to "$NET_PREFIX.0/24" | awk -v b="$BRIDGE" '$2 != b {print $2}' | head -n1)
  [[ -z $other ]] || die "$NET_PREFIX.0/24 is already used by interface $other: choose another B300_NETNS_NET"
  ip link set "$BRIDGE" address "$(mac_of_octet 1)" alias "b300 $CLUSTER_NAME" up
  ip addr replace "$LOGIN_ADDR/24" dev "$BRIDGE"
  for n in "${ALL_NODES[@]}"; do
    ns=$(node_ns "$n") v=$(node_veth "$n")
    netns_exists "$ns" || ip netns add "$ns" || die "cannot create namespace $ns"
    if [[ ! -e /sys/class/net/$v ]]; then
      ip -n "$ns" link del eth0 2>/dev/null || true
      ip link add "$v" type veth peer name eth0 netns "$ns" || die "cannot create veth $v"
    fi
    ip link set "$v" master "$BRIDGE" up
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 address "$(node_mac "$n")" up
    ip -n "$ns" addr replace "$(node_addr "$n")/24" dev eth0
  done
  # Static neighbours everywhere: a silent peer stays silent (an ARP failure would turn
  # into "no route to host" after ~3 s, which no powered-off host on a routed network gives).
  for n in "${ALL_NODES[@]}"; do
    ip neigh replace "$(node_addr "$n")" lladdr "$(node_mac "$n")" dev "$BRIDGE" nud permanent
    ns=$(node_ns "$n")
    ip -n "$ns" neigh replace "$LOGIN_ADDR" lladdr "$(mac_of_octet 1)" dev eth0 nud permanent
    for m in "${ALL_NODES[@]}"; do
      [[ $m == "$n" ]] && continue
      a=$(node_addr "$m")
      ip -n "$ns" neigh replace "$a" lladdr "$(node_mac "$m")" dev eth0 nud permanent
    done
  done
  nft delete table bridge "$NFT_TABLE" 2>/dev/null || true
  _nft_ruleset | nft -f - || die "cannot load nftables table bridge $NFT_TABLE"
}

netns_teardown() {
  local n ns v
  nft delete table bridge "$NFT_TABLE" 2>/dev/null || true
  for n in "${ALL_NODES[@]}"; do
    ns=$(node_ns "$n") v=$(node_veth "$n")
    [[ -e /sys/class/net/$v ]] && ip link del "$v"
    netns_exists "$ns" && ip netns del "$ns"
  done
  if [[ -e /sys/class/net/$BRIDGE ]] &&
    [[ $(cat "/sys/class/net/$BRIDGE/ifalias" 2>/dev/null) == "b300 $CLUSTER_NAME" ]]; then
    ip link del "$BRIDGE"
  fi
  return 0
}

node_port_busy() { # node: its slurmd port listens (in its namespace in this mode)
  local node=$1 port
  port=$(node_port "$node")
  if ((NETNS)); then
    netns_exists "$(node_ns "$node")" && [[ -n $(in_node_ns "$node" ss -Hltn "( sport = :$port )" 2>/dev/null) ]]
  else
    port_busy "$port"
  fi
}

cmd_power_off() { # node (validated)
  local node=$1
  need_root
  need_netns power-off
  # Link first: the processes' sockets then close into a dead link, as on a power cut.
  ip link set "$(node_veth "$node")" down || die "cannot set $(node_veth "$node") down"
  cmd_kill_node "$node" >/dev/null 2>&1
  log "node $node powered off: link down, slurmd and job processes killed -9 (silent from every other host)"
}

cmd_power_on() { # node (validated)
  local node=$1
  need_root
  need_netns power-on
  ip link set "$(node_veth "$node")" up || die "cannot set $(node_veth "$node") up"
  cmd_restart_node "$node"
}

_loss_pct() { # netem args -> P if they are exactly `loss P%` (P integer 0..100)
  (($# == 2)) && [[ $1 == loss && $2 =~ ^([0-9]{1,3})%$ ]] && ((BASH_REMATCH[1] <= 100)) &&
    echo "${BASH_REMATCH[1]}"
}

cmd_netem() { # node args...
  local node=$1 v a pct
  shift
  need_root
  need_netns netem
  (($# >= 1)) || die "netem needs arguments (e.g. 'loss 5% delay 200ms 200ms' or 'clear')"
  for a in "$@"; do [[ $a =~ ^[A-Za-z0-9.%_-]{1,32}$ ]] || die "bad netem argument '$a'"; done
  v=$(node_veth "$node")
  if [[ $* == clear ]]; then
    tc qdisc del dev "$v" root 2>/dev/null || true
    in_node_ns "$node" tc qdisc del dev eth0 root 2>/dev/null || true
    nft flush chain bridge "$NFT_TABLE" "loss_$node"
    log "node $node: link impairment cleared"
    return 0
  fi
  if tc qdisc replace dev "$v" root netem "$@" 2>/dev/null; then
    in_node_ns "$node" tc qdisc replace dev eth0 root netem "$@" || die "tc netem in $(node_ns "$node") failed"
    log "node $node: netem $* on its link (both directions)"
    return 0
  fi
  pct=$(_loss_pct "$@") ||
    die "this kernel has no tc netem (CONFIG_NET_SCH_NETEM); only 'loss P%' is possible here"
  nft flush chain bridge "$NFT_TABLE" "loss_$node"
  nft add rule bridge "$NFT_TABLE" "loss_$node" numgen random mod 100 "<" "$pct" drop
  log "node $node: $pct% of its frames dropped, each direction (nftables; no netem in this kernel)"
}

cmd_partition() { # nodes (validated)
  need_root
  need_netns partition
  local n
  for n in "$@"; do
    nft flush chain bridge "$NFT_TABLE" "cut_$n"
    nft add rule bridge "$NFT_TABLE" "cut_$n" drop
  done
  log "partitioned from the login node: $* (they still reach the other nodes)"
}

cmd_heal() {
  need_root
  need_netns heal
  local n
  for n in "${ALL_NODES[@]}"; do nft flush chain bridge "$NFT_TABLE" "cut_$n"; done
  log "partitions healed"
}

cmd_login_link() { # down|up
  need_root
  need_netns login-link
  nft flush chain bridge "$NFT_TABLE" login_cut
  case $1 in
    down) nft add rule bridge "$NFT_TABLE" login_cut drop; log "login node link down: nothing passes between it and the nodes" ;;
    up) log "login node link up" ;;
    *) die "login-link takes down or up (got '$1')" ;;
  esac
}
