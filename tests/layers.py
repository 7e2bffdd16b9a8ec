#!/usr/bin/env python3
"""The `layers` test of ctest: the layers of src/ (docs/architecture.md#layers) hold.

For each layer, a file that includes a header of a layer above it must not compile with the
flags the build gives that layer's sources, and one that includes a header of a layer below
it must; and no source reaches another folder by a relative path ("../").

    layers.py SOURCE_DIR BUILD_DIR
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

# The kernel side's shared headers (bpf/, the emd_kernel_headers target): taken by the layers
# that know features, refused below them.
KERNEL_HEADER = "common/stacks.h"
KERNEL_LAYERS = {"profile", "tracers"}

# Per layer: a header of a layer above it (refused) and one of a layer below it (taken).
PROBES = {
    "base": ("metrics/metric_store.h", "base/gzip.h"),
    "metrics": ("profile/profile_store.h", "base/yaml_reader.h"),
    "http": ("metrics/metric_store.h", "base/gzip.h"),
    "bpf": ("core/tracer.h", "metrics/metric_scope.h"),
    "core": ("profile/profile_store.h", "bpf/hook_probe.h"),
    "profile": ("tracers/registry.h", "http/server.h"),
    "tracers": ("daemon/config.h", "profile/slow_capture.h"),
}


def compiles(command, directory, header, prefix="ebpf_metricsd/"):
    with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as f:
        f.write(f'#include <linux/types.h>\n#include "{prefix}{header}"\n')
        probe = f.name
    try:
        args = shlex.split(command)
        # The source's own compile line, for the probe and without an output.
        out, skip = [], False
        for a in args:
            if skip:
                skip = False
                continue
            if a == "-o":
                skip = True
                continue
            if a == "-c" or a.endswith((".cpp", ".cc")):
                continue
            out.append(a)
        r = subprocess.run(out + ["-fsyntax-only", probe], cwd=directory,
                           capture_output=True, text=True)
        return r.returncode == 0, r.stderr.strip().splitlines()[:1]
    finally:
        os.unlink(probe)


def main():
    source, build = sys.argv[1], sys.argv[2]
    commands = json.load(open(os.path.join(build, "compile_commands.json")))
    problems = []
    for layer, (above, below) in PROBES.items():
        entry = next((c for c in commands
                      if re.search(rf"/src/{layer}/(?:[^/]+/)*[^/]+\.cpp$", c["file"])), None)
        if not entry:
            problems.append(f"{layer}: no source in compile_commands.json")
            continue
        ok, err = compiles(entry["command"], entry["directory"], above)
        if ok:
            problems.append(f"{layer}: an include of ebpf_metricsd/{above}, a layer above, "
                            "compiles")
        else:
            print(f"{layer}: ebpf_metricsd/{above} refused: {err[0] if err else ''}")
        ok, err = compiles(entry["command"], entry["directory"], below)
        if not ok:
            problems.append(f"{layer}: ebpf_metricsd/{below}, a layer below, does not compile: "
                            f"{err}")
        ok, err = compiles(entry["command"], entry["directory"], KERNEL_HEADER, prefix="")
        if ok != (layer in KERNEL_LAYERS):
            problems.append(f"{layer}: the kernel header {KERNEL_HEADER} "
                            f"{'does not compile' if layer in KERNEL_LAYERS else 'compiles'}")
        elif not ok:
            print(f"{layer}: {KERNEL_HEADER} refused: {err[0] if err else ''}")
    for root, _, files in os.walk(os.path.join(source, "src")):
        for name in files:
            path = os.path.join(root, name)
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    if re.match(r'\s*#\s*include\s*"\.\./', line):
                        problems.append(f"{os.path.relpath(path, source)}:{n}: a relative "
                                        "include reaches out of its folder")
    for p in problems:
        print("problem:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
