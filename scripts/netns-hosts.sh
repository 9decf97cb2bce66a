# Sourced by the multi-host tests: N hosts as network namespaces on one machine, joined
# by veth pairs to a bridge. After `make_hosts N`, host i is the namespace "$tag-h$i" with
# the address "$net.$((10 + i))", `on_host i CMD...` runs a command there, and `cut_host i`
# takes its link down. Everything is removed on exit. Needs root and iproute2; a script
# that sources this exits 77 (cannot run here) when namespaces cannot be made.
tag=sf$$
net=10.213.$(( $$ % 200 + 20 ))
work=$(mktemp -d)
hosts=0
cleanup() {
  for ((i = 0; i < hosts; i++)); do ip netns del "$tag-h$i" 2>/dev/null; ip link del "$tag-v$i" 2>/dev/null; done
  ip link del "$tag-br" 2>/dev/null
  jobs -p | xargs -r kill 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

make_hosts() {
  hosts=$1
  ip netns add "$tag-h0" 2>/dev/null || { echo "network namespaces are not available here"; exit 77; }
  ip link add "$tag-br" type bridge && ip link set "$tag-br" up || exit 77
  for ((i = 0; i < hosts; i++)); do
    [ "$i" = 0 ] || ip netns add "$tag-h$i"
    ip link add "$tag-v$i" type veth peer name "$tag-p$i"
    ip link set "$tag-p$i" netns "$tag-h$i"
    ip link set "$tag-v$i" master "$tag-br" up
    ip netns exec "$tag-h$i" ip addr add "$net.$((10 + i))/24" dev "$tag-p$i"
    ip netns exec "$tag-h$i" ip link set "$tag-p$i" up
    ip netns exec "$tag-h$i" ip link set lo up
  done
}

on_host() { local i=$1; shift; ip netns exec "$tag-h$i" "$@"; }
cut_host() { ip link set "$tag-v$1" down; }
