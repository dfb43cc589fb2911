"""test_bench.py: `make bench` (loadtest/bench.py) in a tiny mode.

Every group of the benchmark runs once with one round of one second, a few
connections and small stocks: the order rows, the spike (a fresh SKU per
run, its books checked), the answers that touch no shared state (the
gateway's sold-out answers come from its shared-memory mark, not Redis)
and the overload run (closed-loop capacity, then the open loop at two
multiples of it, the service's runs verified). What is checked is that each
figure exists and is consistent with the others, that every goal line says
met or NOT met, and that the HTML report is self-contained with its chart;
never how fast anything was. Also the overload row's counting of 503
`overloaded` as shed, whichever flashload reported it."""
import importlib.util
import json
import os
import re
import subprocess

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "loadtest", "bench.py")


def load_bench():
    """loadtest/bench.py as a module (its functions, without running it)."""
    spec = importlib.util.spec_from_file_location("bench", BENCH)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_bench_tiny_run_prints_every_group_and_writes_its_report(ctx):
    out_dir = ctx.path("bench")
    stock = 300
    # One connection count (the full bench's two run the same code twice).
    p = subprocess.run(["/usr/bin/python3", BENCH, harness.BIN, "1", "1", "8",
                        "--spike-stock", str(stock), "--overload-connections", "40",
                        "--overload-seconds", "1", "--overload-rates", "0.5,2",
                        "--overload-timeout", "2", "--quota-factors", "1,2", "--quota-reps", "1",
                        "--out", out_dir],
                       capture_output=True, text=True, timeout=240)
    so = p.stdout
    assert p.returncode == 0, so + p.stderr
    j = json.load(open(os.path.join(out_dir, "bench.json")))
    groups = {t["group"] for t in j["targets"]}
    assert groups == {"orders", "spike", "idle"}, groups
    for t in j["targets"]:
        assert len(t["runs"]) == 1 and t["median"]["rps"] > 0, t

    # The spike: every run sold its fresh SKU's units exactly, by wrk's 201s
    # and by the store (the service's sold, the gateway's Redis stock).
    spikes = [t for t in j["targets"] if t["group"] == "spike"]
    assert len(spikes) == 3, spikes
    for t in spikes:
        run = t["runs"][0]
        assert run["sold"] == stock and run["got201"] == stock and run["exact"], t
    assert "spike: every run sold exactly %d units" % stock in so, so

    # The gateway's sold-out answers touch no Redis (its shared-memory mark).
    gone = [t for t in j["targets"] if t["name"] == "gateway, 2 nginx workers: sold-out POST"]
    assert len(gone) == 1, [t["name"] for t in j["targets"]]
    assert gone[0]["median"]["calls"] < 0.05, gone[0]

    # The overload run: three capacities, each target at each rate.
    ov = j["overload"]
    assert set(ov["capacity"]) == {"flashsale lua", "gateway, 1 nginx worker",
                                   "gateway, 2 nginx workers"}, ov["capacity"]
    assert ov["connections"] == 40 and len(ov["runs"]) == 4, ov
    for o in ov["runs"]:
        assert o["target"] in ("flashsale lua", ov["gateway"]), o
        assert o["offered"] == max(1, round(o["factor"] * ov["capacity"][o["target"]])), o
        assert o["answered"] > 0 and o["goodput"] is not None and o["late"] is not None, o
        assert o["good"] <= o["201"], o
        assert o["201"] + o["409"] + o["shed"] + o["5xx"] + o["other"] == o["answered"], o
        assert o["verified"] is (True if o["target"] == "flashsale lua" else None), o

    # The quota group (inside a container's CPU limit; docs/performance.md,
    # "Inside a CPU quota"): each factor run once, for the service and
    # (where ../shared/peers is) the peer, the service's runs verified; or,
    # not root, said to be skipped.
    q = j["quota"]
    if os.geteuid() != 0:
        assert q == {"skipped": "needs root"}, q
    else:
        svc = [r for r in q["rows"] if r["target"] == "flashsale lua"]
        assert [r["factor"] for r in svc] == [1.0, 2.0] and q["reps"] == 1, q
        for r in svc:
            assert r["runs"] == 1 and r["capacity"] > 0 and r["offered"] > 0, r
            assert r["verified"] is True, r

    # Every goal line (the order path's and the sale spike's goals,
    # docs/performance.md) says met or NOT met.
    labels = [g["what"] for g in j["goals"]]
    for want in ("lua / best gateway, c=8", "spike: service / best gateway, c=8",
                 "GET /healthz / nginx return 200 (best), c=8",
                 "sold-out POST /v1/orders / /healthz", "GET /v1/products/{sku} / /healthz",
                 "overload x2: service goodput / capacity",
                 "overload x2: service answers all within 1 s"):
        assert want in labels, (want, labels)
    goal_lines = [l for l in so.splitlines() if re.search(r"\[(>=|<=|all)", l)]
    assert len(goal_lines) >= 10, so
    for l in goal_lines:
        assert l.rstrip().endswith((": met]", ": NOT met]")), l

    # The report: self-contained, the chart with a mark per overload run.
    page = open(os.path.join(out_dir, "bench.html")).read()
    assert page.count("<svg") == 1 and page.count('class="mark"') == 4, page[:2000]
    assert "<script" not in page and "src=" not in page, page[:2000]
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page), \
        re.findall(r"https?://\S+", page)


def test_overload_row_counts_503_overloaded_as_shed(ctx):
    bench = load_bench()
    base = {"answered": 100, "transport_errors": 0, "backlog": 0,
            "latency_us": {"p50": 1000, "p99": 2000, "max": 3000}}
    # A flashload that counts shed answers itself (and goodput, late ones).
    with_shed = dict(base, status={"201": 60, "409": 10, "503": 30}, codes={"sold_out": 10},
                     shed=25, goodput={"created": 50}, late={"answers": 0})
    row = bench.overload_row(with_shed, 0, "flashsale lua", 2.0, 200, 100, 2.0, True)
    assert row["shed"] == 25 and row["5xx"] == 5 and row["goodput"] == 25.0, row
    assert row["within_1s"] is True, row
    # One that reports them as an error code only: still shed, and what it
    # cannot say is unknown, not zero.
    old = dict(base, status={"201": 60, "409": 10, "503": 30},
               codes={"sold_out": 10, "overloaded": 30}, backlog=3)
    row = bench.overload_row(old, 0, "flashsale lua", 2.0, 200, 100, 2.0, None)
    assert row["shed"] == 30 and row["5xx"] == 0, row
    assert row["goodput"] is None and row["within_1s"] is None, row
