"""The all-reduce across namespace hosts: runs bench/engines_hosts.sh (one rank per host,
W = 2 and 4) and writes the table of Steadfast's mesh over TCP against Open MPI's TCP
transport and against the ring bound (raw TCP streams in a ring over the same links).

Usage: python3 bench/engines_hosts.py   (bench/run.sh engines-hosts does this; needs root)
Environment: WORLDS (default 2,4), MB (default 1,4,16,64,256), RATE (Mbit/s, default 0:
unshaped veth).
"""
import datetime, json, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, publish  # noqa: E402

BIN = os.path.join(ROOT, "target", "release", "steadfast")
WORLDS = [int(w) for w in os.environ.get("WORLDS", "2,4").split(",")]
RATE = os.environ.get("RATE", "0")


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def main():
    out = tempfile.mkdtemp(prefix="engines-hosts-")
    res = subprocess.run(["bash", os.path.join(ROOT, "bench", "engines_hosts.sh"), BIN, out, RATE])
    if res.returncode == 77:
        sys.exit("network namespaces are not available here (needs root and iproute2)")
    if res.returncode != 0:
        sys.exit(f"bench/engines_hosts.sh failed ({res.returncode}); its files are in {out}")
    mpi_version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True,
                                 env=dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
                                          OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")).stdout.splitlines()[0]
    link = "unshaped veth" if RATE == "0" else f"veth shaped to {RATE} Mbit/s each way"
    lines = [
        "<!-- engines-hosts:start -->",
        "## All-reduce across hosts: Steadfast's mesh over TCP, Open MPI's TCP and the ring bound",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores; {mpi_version}.",
        "- Command: `bench/run.sh engines-hosts` (driver: `bench/engines_hosts.py`, hosts: `bench/engines_hosts.sh`).",
        f"- W network-namespace hosts on this machine joined by a bridge ({link}), one rank per host: no two ranks"
        " share a host, so Steadfast's mesh runs over TCP. MPI: `mpirun --mca btl tcp,self --mca"
        " mpi_yield_when_idle 1` with its daemons started in the namespaces by an agent in place of ssh (the hosts"
        " share the cores, which Open MPI cannot see, and its ranks would otherwise spin on their receives)."
        " *ring bound* = the per-stream bandwidth of raw TCP"
        " streams in a ring, every host sending to the next while receiving from the previous (`bench/tcp_ring.py`,"
        " 256 MB, median of 3), which is what a ring all-reduce's bus bandwidth can reach. The hosts share this"
        " machine's cores, so the kernel's work for every link competes with the ranks.",
        "",
        "Bus bandwidth in MB/s (2(W-1)/W x message / time, median of 5 after a warm-up).",
        "",
        "| ranks | message | Steadfast fast | MPI fast | ring bound | fast / MPI | fast / ring bound |"
        " Steadfast reproducible | MPI reproducible | reproducible time / fast | same bits (reproducible) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in WORLDS:
        sf = {(r["mb"], r["mode"]): r for r in rows(os.path.join(out, f"{w}-steadfast.jsonl"))}
        mp = {(r["mb"], r["mode"]): r for r in rows(os.path.join(out, f"{w}-mpi.jsonl"))}
        bound = rows(os.path.join(out, f"{w}-ring.jsonl"))[0]["stream_mb_per_s"]
        for mb in sorted({k[0] for k in sf}):
            f, r = sf[(mb, "fast")], sf[(mb, "reproducible")]
            mf, mr = mp[(mb, "fast")], mp[(mb, "reproducible")]
            same = "yes" if r["sum_fingerprint"] == mr["sum_fingerprint"] else "no"
            lines.append(
                f"| {w} | {mb} MB | {f['bus_mb_per_s']:.0f} | {mf['bus_mb_per_s']:.0f} | {bound:.0f} |"
                f" {f['bus_mb_per_s'] / mf['bus_mb_per_s']:.2f}x | {f['bus_mb_per_s'] / bound:.2f}x |"
                f" {r['bus_mb_per_s']:.0f} | {mr['bus_mb_per_s']:.0f} | {r['seconds'] / f['seconds']:.2f}x | {same} |")
    lines.append("<!-- engines-hosts:end -->")
    publish("engines-hosts", lines)


if __name__ == "__main__":
    main()
