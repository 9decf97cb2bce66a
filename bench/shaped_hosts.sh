# Sourced by the across-hosts benchmarks: $2 network-namespace hosts (default three;
# scripts/netns-hosts.sh) whose links are shaped to $1 Mbit/s in both directions (the
# host's end of its veth pair: what it sends; the bridge's end: what it receives).
# Exits 77 where tc cannot shape.
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/netns-hosts.sh"
make_hosts "${2:-3}"
for ((i = 0; i < ${2:-3}; i++)); do
  on_host "$i" tc qdisc add dev "$tag-p$i" root tbf rate "${1}mbit" burst 1mb latency 100ms || exit 77
  tc qdisc add dev "$tag-v$i" root tbf rate "${1}mbit" burst 1mb latency 100ms || exit 77
done
