"""Reading the result files (tab-separated) that the commands of test/bench write, and the
"median [min–max]" cells of their reports; shared by the report scripts."""
import os
import statistics


def reader(res):
    """rows(name): the rows of RES/name as lists of fields ([] if the file is absent)."""
    def rows(name):
        path = os.path.join(res, name)
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [line.rstrip("\n").split("\t") for line in f if line.strip()]
    return rows


def span(xs, f=".0f"):
    """median [min–max] of xs (None left out); a lone value alone; "-" for none.  Each value is
    rounded before it is formatted, so that one that rounds to zero prints as 0, not -0."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return "-"

    def fmt(x):
        return f"{round(x, int(f[1])) + 0.0:{f}}"
    if len(xs) == 1:
        return fmt(xs[0])
    return f"{fmt(statistics.median(xs))} [{fmt(xs[0])}–{fmt(xs[-1])}]"
