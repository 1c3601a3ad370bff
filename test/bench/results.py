"""Reading the result files (tab-separated) that test/bench/run, load and levers write; shared by
their report scripts (report.py, load_report.py, levers_report.py)."""
import os


def reader(res):
    """rows(name): the rows of RES/name as lists of fields ([] if the file is absent)."""
    def rows(name):
        path = os.path.join(res, name)
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [line.rstrip("\n").split("\t") for line in f if line.strip()]
    return rows
