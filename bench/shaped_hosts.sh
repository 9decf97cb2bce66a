# Sourced by the across-hosts benchmarks: three network-namespace hosts
# (scripts/netns-hosts.sh) whose links are shaped to $1 Mbit/s in both directions (the
# host's end of its veth pair: what it sends; the bridge's end: what it receives).
# Exits 77 where tc cannot shape.
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/netns-hosts.sh"
make_hosts 3
for i in 0 1 2; do
  on_host "$i" tc qdisc add dev "$tag-p$i" root tbf rate "${1}mbit" burst 1mb latency 100ms || exit 77
  tc qdisc add dev "$tag-v$i" root tbf rate "${1}mbit" burst 1mb latency 100ms || exit 77
done
