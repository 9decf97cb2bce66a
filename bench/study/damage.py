"""The damage the checkpoint study does to each system's checkpoint."""
import os
import shutil

KINDS = ["bit flip", "truncation"]


def damaged_copy(clean, dest, kind):
    """Copies the checkpoint `clean` (a file or a directory) to `dest` and damages its
    largest file: one bit flipped in the middle (`bit flip`), or cut to half its length
    (`truncation`)."""
    if os.path.isdir(clean):
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(clean, dest)
        files = [os.path.join(d, f) for d, _, fs in os.walk(dest) for f in fs]
    else:
        shutil.copy(clean, dest)
        files = [dest]
    victim = max(files, key=os.path.getsize)
    data = bytearray(open(victim, "rb").read())
    if kind == "bit flip":
        data[len(data) // 2] ^= 0x10
    else:
        data = data[: len(data) // 2]
    with open(victim, "wb") as f:
        f.write(bytes(data))
