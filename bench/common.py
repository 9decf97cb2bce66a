"""Helpers shared by the benchmark drivers."""
import os
import platform


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def write_section(path, name, section):
    """Replaces the section between `<!-- name:start -->` and `<!-- name:end -->` of the
    Markdown file at `path`, or appends it."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        text = before + section + after
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(text)


def publish(name, lines):
    """Prints a benchmark's section (its lines, markers included) and writes it into
    docs/benchmarks.md in place of the section of the same name."""
    section = "\n".join(lines)
    print(section)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    write_section(os.path.join(root, "docs", "benchmarks.md"), name, section)
