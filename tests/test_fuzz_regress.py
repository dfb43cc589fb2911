"""test_fuzz_regress.py: the request fuzzer's seeds and every input it ever
found (tests/fuzz/corpus/request, tests/fuzz/regress/request), replayed
against bin/flashsale with the fuzzer's own checks (tests/fuzzreplay.py),
then the stock books audited. `make fuzz` finds; this keeps fixed."""
import glob
import os
import subprocess

import fuzzreplay
from harness import BIN

HERE = os.path.dirname(os.path.abspath(__file__))
SEED_PRODUCTS = [  # what fuzz_request.c creates before fuzzing
    {"sku": "p1", "stock": 1000000}, {"sku": "seg", "stock": 1000, "segments": 4},
    {"sku": "lim", "stock": 1000, "per_user_limit": 2},
    {"sku": "dbp", "stock": 1000, "strategy": "db"}, {"sku": "lk", "stock": 1000, "strategy": "lock"},
    {"sku": "dl", "stock": 1000, "strategy": "db-lock"},
]


def test_request_fuzz_inputs_replay(ctx):
    redis = ctx.redis()
    s = ctx.service(redis, args=["--request-timeout", "1", "--threads", "2"])
    for p in SEED_PRODUCTS:
        assert s.post("/v1/products", p).status == 201
    files = sorted(glob.glob(os.path.join(HERE, "fuzz", "corpus", "request", "*")) +
                   glob.glob(os.path.join(HERE, "fuzz", "regress", "request", "*")))
    assert len(files) > 30, files
    for f in files:
        with open(f, "rb") as fh:
            data = fh.read()
        try:
            fuzzreplay.replay(s.port, data)
        except AssertionError as e:
            raise AssertionError("%s: %s" % (os.path.relpath(f, HERE), e))
        assert s.proc.poll() is None, "flashsale died on %s" % f
    s.client.close()
    out = ""
    for _ in range(40):                  # confirms run just after the answers: settle
        p = subprocess.run([os.path.join(BIN, "flashsale"), "audit", "--redis", redis.url,
                            "--db", s.db_path], capture_output=True, text=True)
        out = p.stdout + p.stderr
        if p.returncode == 0:
            break
        import time
        time.sleep(0.05)
    assert p.returncode == 0, out
    print("    %d inputs replayed, books balanced" % len(files))
