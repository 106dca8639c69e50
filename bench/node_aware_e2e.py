#!/usr/bin/env python3
"""Flat against node-aware compressed collectives on two emulated nodes
(bench/netem_two_nodes.sh: 4 ranks as 2 nodes x 2, shared memory inside
each, 1 Gbit/s each way between them, 1 thread per rank), with the
planner's prediction beside each measurement (docs/guides/multi-node.md
"Measured"), planned with this machine's costs calibrated first
(`python -m dsopt.plan --calibrate`, one thread, as many copies at once as
it has cores) and the links measured on the same emulation
(bench/measure_node_links.py): inside a node the shared-memory groups'
latency and bandwidth, between the nodes the rails' latency and the
bandwidth each node's interface gives MPI's all-to-alls, the exchange the
compressed collectives make (on the emulated link about 0.6 of its
nominal 1 Gbit/s; a ring between two ranks gets all of it).

    python3 bench/node_aware_e2e.py --build build-dev [--runs 3] [--forms flat,node_aware,node_aware_1bit]

Runs, per form (the config key "topology": {"hierarchy": FORM,
"ranks_per_node": 2}; the form node_aware_1bit is "node_aware" with
"node_reduce": "1bit", for 1-bit Adam only):
  * the 1-bit compressed allreduce alone (compressed_allreduce_bench, one
    call on 16M floats per rank; the planner's figure is its compressed
    step of that one tensor less the update);
  * 1-bit Adam end to end (onebit_e2e_bench, 8.5M fp32 parameters): its
    compression-stage steps;
  * compressed ZeRO-2 int4/int8 and int8/int8 end to end
    (compressed_zero_bench, 8M fp32 parameters), with uncompressed ZeRO-2.
Each row: step time (median and min-max of the per-run medians), the bytes
across the boundary per step as the library counts them
(info.bytes_inter_node) and as
the emulated link counted them (htb, both directions, headers included),
and the planner's step time and bytes across nodes for the same set-up
(for 1-bit Adam given the measured seconds of its step outside dsopt_step
as its compute, and beside its dsopt_step part the planner's step less
them).
A node-aware row prints "not available" when the library does not run the
form yet (no info.bytes_inter_node, or the same count as the flat form).
Needs root (the emulation); exits 77 when it cannot run here.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))

NP, RPN = 4, 2
ZERO_NUMEL = 8 << 20
ONEBIT_SIZES = [131072 * 64, 131072]   # onebit_e2e_bench's default model
CAR_NUMEL = 1 << 24                    # the 1-bit allreduce alone: floats per rank
PAIRS = ("int4/int8", "int8/int8")


def netem(args, env_extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", DSOPT_NETEM_NP=str(NP), DSOPT_NETEM_RANKS_PER_NODE=str(RPN))
    env.update(env_extra or {})
    out = subprocess.run([os.path.join(HERE, "netem_two_nodes.sh"), *args], env=env, capture_output=True,
                         text=True)
    text = out.stdout + out.stderr
    if out.returncode == 77:
        print(text.strip().splitlines()[-1])
        sys.exit(77)
    if out.returncode != 0:
        sys.stderr.write(text[-4000:])
        raise SystemExit(f"node_aware_e2e: {' '.join(args[:1])} failed ({out.returncode})")
    return text


def topo_flags(form):
    """form: "flat", "node_aware" or "node_aware_1bit" (node-aware with the
    1-bit node step, "node_reduce": "1bit": the 1-bit family only)."""
    flags = ["--hierarchy", form.replace("_1bit", ""), "--ranks-per-node", str(RPN)]
    return flags + (["--node-reduce", "1bit"] if form.endswith("_1bit") else [])


def run_onebit(build, form, steps):
    text = netem([os.path.join(build, "bench", "onebit_e2e_bench"), "--adam", "0", "--threads", "1",
                  "--steps", str(steps), "--print-every", "0", "--step-log", "1", *topo_flags(form)])
    rows = [line.split()[1:] for line in text.splitlines() if line.startswith("steplog: ")]
    # "1-bit", "Adam", step, phase, step_s, opt_s, bytes, inter, wire
    comp = [r for r in rows if r[3] == "2"][3:]          # DSOPT_PHASE_COMPRESSED, the first 3 left out
    if not comp:
        comp = [r for r in rows[-(steps // 2):]]
    return {"step": statistics.median(float(r[4]) for r in comp),
            "opt": statistics.median(float(r[5]) for r in comp),
            "inter": int(comp[-1][7]), "wire": statistics.median(int(r[8]) for r in comp)}


def run_car(build, form):
    """The 1-bit compressed allreduce alone (compressed_allreduce_bench),
    one call on CAR_NUMEL floats per rank in the form's own row: "1-bit
    CAR" (flat) or "1-bit node-aware"."""
    text = netem([os.path.join(build, "bench", "compressed_allreduce_bench"), "--threads", "1",
                  "--min-numel", str(CAR_NUMEL), "--max-numel", str(CAR_NUMEL), *topo_flags(form)])
    label = "1-bit CAR" if form == "flat" else "1-bit node-aware"
    for line in text.splitlines():
        if line.strip().startswith(label + " "):
            # operation, median s, best s, B/rank Comm, form., across Comm, form., B/rank lo, B/rk link
            f = line.strip()[len(label):].split()
            # (the bench prints its byte counts to 5 significant digits)
            return {"step": float(f[0]), "inter": int(float(f[4])), "inter_text": f[4],
                    "wire": int(float(f[7]) * NP)}
    raise SystemExit(f"node_aware_e2e: no {label!r} row in compressed_allreduce_bench's output:\n" + text[-2000:])


def run_zero(build, form, steps):
    text = netem([os.path.join(build, "bench", "compressed_zero_bench"), "--numel", str(ZERO_NUMEL),
                  "--bytes-numel", "0", "--bf16", "0", "--threads", "1", "--steps", str(steps),
                  "--time-pairs", ",".join(PAIRS), *topo_flags(form)])
    out = {}
    for line in text.splitlines():
        m = re.match(r"samples: (\S+) (.*) \| ZeRO-2 (.*)", line)
        if m:
            out.setdefault(m.group(1), {})["step"] = statistics.median(map(float, m.group(2).split()))
            out.setdefault("ZeRO-2", {})["step"] = statistics.median(map(float, m.group(3).split()))
        m = re.match(r"inter_node: (\S+) (\S+) \| ZeRO-2 (\S+)", line)
        if m:
            out.setdefault(m.group(1), {})["inter"] = -1 if m.group(2) == "n/a" else int(m.group(2))
            out.setdefault("ZeRO-2", {})["inter"] = -1 if m.group(3) == "n/a" else int(m.group(3))
        m = re.match(r"wire_cross: (\S+) (\S+) \| ZeRO-2 (\S+)", line)
        if m:
            out.setdefault(m.group(1), {})["wire"] = int(m.group(2)) if m.group(2) != "n/a" else -1
            out.setdefault("ZeRO-2", {})["wire"] = int(m.group(3)) if m.group(3) != "n/a" else -1
    return out


def calibrate(build):
    """This machine's costs per element (`python -m dsopt.plan --calibrate`),
    one thread per optimizer as the ranks run, in as many copies at once as
    the ranks have cores (their memory bandwidth shared as in the runs;
    the planner's cpu_oversubscription charges the ranks beyond the
    cores). Returns the profile's path."""
    path = os.path.join(os.path.abspath(build), "node_aware_profile.json")
    copies = min(NP, os.cpu_count() or 1)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(ROOT, "bindings", "python"))
    out = subprocess.run([sys.executable, "-m", "dsopt.plan", "--calibrate", "--threads", "1", "--concurrent",
                          str(copies), "--profile", path], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("node_aware_e2e: calibration failed:\n" + (out.stdout + out.stderr)[-2000:])
    print(f"profile calibrated on this machine ({copies} copies at once, 1 thread each): {path}")
    return path


def measure_links(profile_path):
    """{"node": (latency s, bandwidth B/s), "rail": ...} of the emulated
    nodes (bench/measure_node_links.py under the emulation)."""
    env = {"PYTHONPATH": os.path.join(ROOT, "bindings", "python")}
    text = netem([sys.executable, os.path.join(HERE, "measure_node_links.py"), "--profile", profile_path], env)
    links = {}
    for line in text.splitlines():
        m = re.match(r"link: (\w+) latency (\S+) bandwidth (\S+)", line)
        if m:
            links[m.group(1)] = (float(m.group(2)), float(m.group(3)))
        m = re.match(r"link: across alltoall bandwidth (\S+)", line)
        if m:
            links["across"] = float(m.group(1))
    if set(links) != {"node", "rail", "across"}:
        raise SystemExit("node_aware_e2e: measure_node_links.py measured no links:\n" + text[-2000:])
    return links


def predictions(form, profile_path, links, onebit_compute=0.0):
    """The planner's step times and bytes across nodes: inside a node the
    measured shared-memory link, between nodes the all-to-all bandwidth
    measured per node with the measured rail latency. `onebit_compute`:
    the seconds of 1-bit Adam's step outside dsopt_step (its forward and
    backward, measured),
    which the planner takes as the step's compute; the ZeRO rows time the
    optimizer alone."""
    from dsopt.plan import Cluster, Model, plan
    from dsopt.plan.bytes import car_pair
    from dsopt.plan.configs import Config, Settings
    from dsopt.plan.profile import load
    prof = load(profile_path)
    (intra_lat, intra_bw), (inter_lat, _) = links["node"], links["rail"]
    cluster = Cluster.parse(NP, RPN, intra=f"{intra_bw:.0f}B/s", inter=f"{links['across']:.0f}B/s",
                            intra_latency=f"{intra_lat:.9f}s", inter_latency=f"{inter_lat:.9f}s",
                            cpu_oversubscription=NP / max(1, os.cpu_count() or 1),
                            hierarchy=form.replace("_1bit", ""), node_reduce="1bit" if form.endswith("_1bit") else "fp32")
    out = {}
    # The allreduce alone: a compressed step of a one-tensor model less its
    # update (no compute); its bytes across nodes, one call's.
    car_model = Model.from_sizes([CAR_NUMEL], "fp32")
    r = plan(car_model, cluster, 0.0, prof, Settings(steps=40, freeze_step=8), [Config("OneBitAdam")])[0]
    st = r.phase_times["compressed"]
    out["1-bit allreduce"] = (st.total - st.update, car_pair(Config("OneBitAdam"), car_model, cluster.topo)[1])
    ob = Model.from_sizes(ONEBIT_SIZES, "fp32")
    r = plan(ob, cluster, onebit_compute, prof, Settings(steps=40, freeze_step=8), [Config("OneBitAdam")])[0]
    out["1-bit Adam"] = (r.phase_times["compressed"].total, r.cross_bytes.compressed)
    if form.endswith("_1bit"):  # compressed ZeRO has no 1-bit node step
        return out, cluster.describe()
    z = Model.from_params(ZERO_NUMEL, "fp32", tensors=36)
    s = Settings(reduce_bucket_size=1 << 22, allgather_bucket_size=1 << 22)
    for rec in plan(z, cluster, 0.0, prof, s, [Config("zero2")] + [Config("czero", *p.split("/")) for p in PAIRS]):
        out[rec.name] = (rec.time.total, rec.cross_bytes.steady)
    return out, cluster.describe()


def cell(values, fmt="{:.3f}"):
    if not values:
        return "-"
    med = statistics.median(values)
    return fmt.format(med) + (f" ({fmt.format(min(values))}-{fmt.format(max(values))})" if len(values) > 1 else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build-dev"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--forms", default="flat,node_aware")
    ap.add_argument("--onebit-steps", type=int, default=40)
    ap.add_argument("--zero-steps", type=int, default=5)
    ap.add_argument("--profile", help="the planner's profile (default: calibrate this machine first, "
                    "as many copies at once as it has cores, and save it in the build folder)")
    a = ap.parse_args()
    forms = [f.strip() for f in a.forms.split(",") if f.strip()]
    print(f"machine: {os.cpu_count()} cores; {NP} ranks as 2 nodes x {RPN}, 1 Gbit/s each way between them "
          f"(bench/netem_two_nodes.sh), 1 thread per rank; {a.runs} run(s) per row, the forms in turn; "
          "time: median of the runs' medians (min-max); bytes across the boundary per step: "
          "library = info.bytes_inter_node (rank 0), link = htb counters (all ranks, both directions, "
          "headers included)")
    results = {}
    flat_inter = {}
    if not a.profile:
        a.profile = calibrate(a.build)
    links = measure_links(a.profile)
    print("links measured (bench/measure_node_links.py): " +
          ", ".join(f"{k}: latency {links[k][0] * 1e6:.0f} us, {links[k][1] / 1e6:.0f} MB/s per rank"
                    for k in ("node", "rail")) +
          f"; across the nodes in all-to-alls {links['across'] / 1e6:.1f} MB/s per node each way")
    # The forms take turns, run by run, so that the machine's drift over
    # the harness falls on every form alike.
    for form in forms:
        zero = not form.endswith("_1bit")
        results[form] = {"1-bit allreduce": [], "1-bit Adam": [],
                         **({f"ZeRO-2 {p}": [] for p in PAIRS} if zero else {}), **({"ZeRO-2": []} if zero else {})}
    for _ in range(a.runs):
        for form in forms:
            runs = results[form]
            runs["1-bit allreduce"].append(run_car(a.build, form))
            runs["1-bit Adam"].append(run_onebit(a.build, form, a.onebit_steps))
            if form.endswith("_1bit"):
                continue
            z = run_zero(a.build, form, a.zero_steps)
            for p in PAIRS:
                runs[f"ZeRO-2 {p}"].append(z.get(p, {}))
            runs["ZeRO-2"].append(z.get("ZeRO-2", {}))
    for form in forms:
        print(f"\n== {form}")
        runs = results[form]
        compute = statistics.median(r["step"] - r["opt"] for r in runs["1-bit Adam"])
        pred, desc = predictions(form, a.profile, links, compute)
        print(f"planner cluster {desc}; 1-bit Adam's compute (its step outside dsopt_step, measured) "
              f"{compute:.3f} s")
        print(f"{'row':<20} {'step s':>24} {'library B/step':>15} {'link B/step':>24} "
              f"{'planner s':>10} {'planner B/step':>15}")
        for name, rs in runs.items():
            pt, pb = pred.get(name, (float("nan"), None))
            key = "step"
            times = [r[key] for r in rs if key in r]
            inter = [r.get("inter", -1) for r in rs]
            wire = [r.get("wire", -1) for r in rs if r.get("wire", -1) >= 0]
            lib = "n/a" if not inter or inter[0] < 0 else rs[0].get("inter_text", f"{inter[0]:,}")
            if form == "flat":
                flat_inter[name] = inter[0] if inter else -1
            elif name != "ZeRO-2" and (not inter or inter[0] < 0 or inter[0] == flat_inter.get(name)):
                print(f"{name:<20} {'not available (the library runs this form flat or reports no bytes_inter_node)':>60}"
                      f"   planner {pt:.3f} s, {pb:,} B")
                continue
            print(f"{name:<20} {cell(times):>24} {lib:>15} {cell(wire, '{:,.0f}'):>24} {pt:>10.3f} {pb:>15,}")
            if name == "1-bit Adam":  # the planner's step less the measured compute it was given
                print(f"{'  (dsopt_step part)':<20} {cell([r['opt'] for r in rs]):>24} {'':>15} {'':>24} "
                      f"{pt - compute:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
