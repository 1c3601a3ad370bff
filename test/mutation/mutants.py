#!/usr/bin/env python3
"""The mutant list of test/mutation: parse it, check that every pattern still
matches, apply one mutant to a copy of the tree.

The list (test/mutation/mutants.txt) is a sequence of blocks:

    [id]
    intent: the bug this simulates, in words
    file: src/claim.c
    find: exact text that occurs exactly once in the file
    replace: what it becomes
    (more find/replace pairs, applied in order, each must match exactly once; another
    file: line makes the pairs after it apply to that file)
    also: t/007_sweep_backlog.pl       (optional, repeatable: a suite to run after the fast
                                        ones: a TAP test of test/tap/t, "fuzz", "hashed-keys"
                                        or "api")
    sample: yes                        (optional: part of the short sample of test/run)
    equivalent: why no test can tell  (optional: not run, counted apart)

In find and replace, \\n stands for a newline, \\t for a tab and \\\\ for a
backslash; everything else is literal (leading and trailing spaces are
kept, except the one after the colon).  Lines starting with # are comments.

Usage:
    mutants.py list LIST [--sample] [ID...]   one line per mutant, tab-separated:
                                              id, state (run/equivalent), sample, also suites, intent
    mutants.py check LIST ROOT [ID...]        exit 1 if any pattern does not match exactly once
    mutants.py apply LIST ID ROOT             apply one mutant to the tree at ROOT
    mutants.py show LIST ID                   print one mutant's block, as parsed
"""
import re
import sys

KEYS = {"intent", "file", "find", "replace", "also", "sample", "equivalent"}


class ListError(Exception):
    pass


def unescape(s):
    out = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            n = s[i + 1]
            if n == "n":
                out.append("\n")
            elif n == "t":
                out.append("\t")
            elif n == "\\":
                out.append("\\")
            else:
                out.append(c + n)
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse(path):
    mutants = []
    cur = None
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            m = re.fullmatch(r"\[([A-Za-z0-9_.-]+)\]\s*", line)
            if m:
                cur = {"id": m.group(1), "line": lineno, "edits": [], "also": [],
                       "sample": False, "equivalent": None, "intent": None, "file": None}
                if any(x["id"] == cur["id"] for x in mutants):
                    raise ListError(f"{path}:{lineno}: duplicate mutant id {cur['id']}")
                mutants.append(cur)
                continue
            m = re.match(r"([a-z]+):(?: (.*))?$", line)
            if not m or m.group(1) not in KEYS:
                raise ListError(f"{path}:{lineno}: cannot read: {line!r}")
            if cur is None:
                raise ListError(f"{path}:{lineno}: a field before the first [id]")
            key, value = m.group(1), m.group(2) or ""
            if key == "find":
                if not cur["file"]:
                    raise ListError(f"{path}:{lineno}: find before any file:")
                cur["edits"].append([cur["file"], unescape(value), None])
            elif key == "replace":
                if not cur["edits"] or cur["edits"][-1][2] is not None:
                    raise ListError(f"{path}:{lineno}: replace without its find")
                cur["edits"][-1][2] = unescape(value)
            elif key == "also":
                cur["also"].append(value.strip())
            elif key == "sample":
                cur["sample"] = value.strip().lower() in ("yes", "true", "1")
            else:
                cur[key] = value.strip()
    for mu in mutants:
        where = f"{path}:{mu['line']}: mutant {mu['id']}"
        if not mu["intent"]:
            raise ListError(f"{where} has no intent")
        if not mu["file"]:
            raise ListError(f"{where} has no file")
        if not mu["edits"]:
            raise ListError(f"{where} has no find/replace")
        for _, find, rep in mu["edits"]:
            if rep is None:
                raise ListError(f"{where}: a find without its replace")
            if find == rep:
                raise ListError(f"{where}: a replace equal to its find")
            if not find:
                raise ListError(f"{where}: an empty find")
    return mutants


def select(mutants, ids, sample=False):
    if ids:
        known = {m["id"]: m for m in mutants}
        missing = [i for i in ids if i not in known]
        if missing:
            raise ListError("no such mutant: " + ", ".join(missing))
        return [known[i] for i in ids]
    if sample:
        return [m for m in mutants if m["sample"]]
    return mutants


def frozen_scripts(root):
    """The released install scripts (test/upgrade/released.sha256): nothing installs them by
    default, so a mutant there changes nothing the suites run."""
    try:
        with open(f"{root}/test/upgrade/released.sha256", encoding="utf-8") as f:
            return {"src/sql/" + line.split()[1] for line in f
                    if line.strip() and not line.startswith("#") and len(line.split()) == 2}
    except OSError:
        return set()


def mutated_texts(root, mu):
    """{path: text} of the files with the mutant applied, or raise ListError (stale)."""
    texts = {}
    frozen = frozen_scripts(root)
    for n, (name, find, rep) in enumerate(mu["edits"], 1):
        if name in frozen:
            raise ListError(f"STALE: {name} is a released, frozen install script that the suites do not "
                            "install: point the mutant at the default version's script")
        path = f"{root}/{name}"
        if path not in texts:
            try:
                with open(path, encoding="utf-8") as f:
                    texts[path] = f.read()
            except OSError as e:
                raise ListError(f"STALE: {name}: {e.strerror}")
        count = texts[path].count(find)
        if count != 1:
            raise ListError(f"STALE: pattern {n} ({find[:60]!r}) matches {count} times in {name}, not once")
        texts[path] = texts[path].replace(find, rep, 1)
    return texts


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, listfile = argv[1], argv[2]
    try:
        mutants = parse(listfile)
        if cmd == "list":
            args = argv[3:]
            sample = "--sample" in args
            ids = [a for a in args if a != "--sample"]
            for m in select(mutants, ids, sample):
                state = "equivalent" if m["equivalent"] else "run"
                print("\t".join([m["id"], state, "sample" if m["sample"] else "-",
                                 " ".join(m["also"]) or "-", m["intent"]]))
            return 0
        if cmd == "check":
            root, ids = argv[3], argv[4:]
            bad = 0
            for m in select(mutants, ids):
                try:
                    mutated_texts(root, m)
                except ListError as e:
                    print(f"{m['id']}\t{e}")
                    bad += 1
            return 1 if bad else 0
        if cmd == "apply":
            mid, root = argv[3], argv[4]
            (m,) = select(mutants, [mid])
            for path, text in mutated_texts(root, m).items():
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            return 0
        if cmd == "show":
            (m,) = select(mutants, [argv[3]])
            print(f"[{m['id']}]  intent: {m['intent']}")
            for name, find, rep in m["edits"]:
                print(f"  {name}\n  - {find!r}\n  + {rep!r}")
            if m["equivalent"]:
                print(f"  equivalent: {m['equivalent']}")
            return 0
    except ListError as e:
        print(f"{listfile}: {e}", file=sys.stderr)
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
