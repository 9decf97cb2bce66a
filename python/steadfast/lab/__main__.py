"""`python -m steadfast.lab replay DIR --trials N,M`: replay trials of a PyTorch campaign
bit for bit and print them, as `steadfast campaign DIR/spec.toml --replay N,M` does."""
import argparse
import sys

from . import LabError, replay


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m steadfast.lab", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("replay", help="replay trials of a campaign bit for bit and print them",
                       epilog="example: python -m steadfast.lab replay runs/sdc-torch --trials 17,230")
    r.add_argument("dir", help="the campaign's directory (where spec.toml and trials.csv are)")
    r.add_argument("--trials", required=True, help="comma-separated trial indices")
    r.add_argument("--keep", help="for one trial of a checkpoint campaign: leave the altered checkpoint here")
    a = p.parse_args(argv)
    try:
        indices = [int(x) for x in a.trials.split(",") if x.strip()]
    except ValueError:
        p.error(f"--trials {a.trials!r}: give comma-separated integers")
    try:
        for text, _, _ in replay(a.dir, indices, keep=a.keep):
            print(text, end="")
    except (LabError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
