#!/usr/bin/env python3
"""Fails when a quoted #include in lib/, include/ or apps/ points up the folder stack.

The stack, bottom to top (a folder may include its own files and those of folders below it):
    kernels, ir  ->  io  ->  analysis  ->  report  ->  rewrite  ->  rules  ->  verify  ->  check  ->  api  ->  apps
`kernels` and `ir` share the bottom and do not include each other; the files directly in include/bnfold/
(error.h, version.h) sit below everything.

Usage: check_layers.py [ROOT]      ROOT defaults to the repository holding this script
       check_layers.py --self-test builds a small tree with one upward include and checks it is caught
"""

import os
import re
import sys
import tempfile

STACK = [["kernels", "ir"], ["io"], ["analysis"], ["report"], ["rewrite"], ["rules"], ["verify"], ["check"], ["api"],
         ["apps"]]
RANK = {folder: rank for rank, folders in enumerate(STACK) for folder in folders}
BASE = "<base>"  # include/bnfold/*.h itself
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".in")


def folder_of(root, path):
    """The stack folder `path` (absolute) belongs to, or None when it is outside lib/, include/bnfold/ and apps/."""
    rel = os.path.relpath(path, root).split(os.sep)
    if rel[0] == "apps":
        return "apps"
    if rel[0] == "lib" and len(rel) > 2:
        return rel[1]
    if rel[:2] == ["include", "bnfold"]:
        return rel[2] if len(rel) > 3 else BASE
    return None


def resolve(root, including_file, name):
    """Where a quoted include lands: beside the including file, then under lib/, then under include/."""
    for base in (os.path.dirname(including_file), os.path.join(root, "lib"), os.path.join(root, "include")):
        candidate = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(candidate):
            return candidate
    if name.startswith("bnfold/"):  # a generated header (version.h) or one not written yet
        return os.path.normpath(os.path.join(root, "include", name))
    first = name.split("/")[0]
    if first in RANK:
        return os.path.normpath(os.path.join(root, "lib", name))
    return None


def allowed(source, target):
    if target is None or target == source or target == BASE:
        return True
    if source == BASE:
        return False
    if source not in RANK or target not in RANK:
        return False  # a folder the stack does not place: place it first
    return RANK[target] < RANK[source]


def violations(root):
    found = []
    for top in ("lib", "include", "apps"):
        for directory, _, files in os.walk(os.path.join(root, top)):
            for file_name in sorted(files):
                if not file_name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(directory, file_name)
                source = folder_of(root, path)
                if source is None:
                    continue
                with open(path, encoding="utf-8", errors="replace") as handle:
                    for number, line in enumerate(handle, 1):
                        match = INCLUDE.match(line)
                        if not match:
                            continue
                        landed = resolve(root, path, match.group(1))
                        target = folder_of(root, landed) if landed else None
                        if not allowed(source, target):
                            found.append("%s:%d: %s (%s) includes \"%s\" (%s)" % (
                                os.path.relpath(path, root), number, source, rank_text(source), match.group(1),
                                target if target in RANK else "%s, not in the stack" % target))
    return found


def rank_text(folder):
    return "level %d" % RANK[folder] if folder in RANK else "outside the stack"


def check(root):
    found = violations(root)
    for line in found:
        print(line, file=sys.stderr)
    if found:
        print("%d include(s) point up the folder stack (scripts/check_layers.py lists the order)" % len(found),
              file=sys.stderr)
        return 1
    return 0


def self_test():
    def write(root, rel, text):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)

    with tempfile.TemporaryDirectory() as root:
        write(root, "include/bnfold/error.h", "#pragma once\n")
        write(root, "include/bnfold/ir/graph.h", '#pragma once\n#include "bnfold/error.h"\n')
        write(root, "include/bnfold/rewrite/rewriter.h", '#pragma once\n#include "bnfold/ir/graph.h"\n')
        write(root, "lib/rewrite/driver.cpp", '#include "bnfold/rewrite/rewriter.h"\n#include "helper.h"\n')
        write(root, "lib/rewrite/helper.h", "#pragma once\n")
        write(root, "lib/rules/rule.cpp", '#include "rewrite/helper.h"\n')
        write(root, "apps/tool/main.cpp", '#include "bnfold/rewrite/rewriter.h"\n')
        if violations(root):
            print("self-test: a clean tree was reported: %s" % violations(root), file=sys.stderr)
            return 1
        write(root, "lib/rewrite/driver.cpp", '#include "bnfold/rewrite/rewriter.h"\n#include "rules/rule.h"\n')
        write(root, "lib/rules/rule.h", "#pragma once\n")
        write(root, "include/bnfold/ir/model.h", '#pragma once\n#include "bnfold/rewrite/rewriter.h"\n')
        write(root, "lib/kernels/math.h", '#pragma once\n#include "bnfold/ir/graph.h"\n')
        found = violations(root)
        expected = ["lib/rewrite/driver.cpp", "include/bnfold/ir/model.h", "lib/kernels/math.h"]
        missed = [name for name in expected if not any(line.startswith(name + ":") for line in found)]
        if missed or len(found) != len(expected):
            print("self-test: expected upward includes in %s, got %s" % (expected, found), file=sys.stderr)
            return 1
    print("self-test passed")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    sys.exit(check(os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else
                   os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
