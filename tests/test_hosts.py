"""test_hosts.py: flashsale on many hosts, and the faults between them
(issue 31). Every host is a network namespace of this machine
(tests/hosts.py): Redis primary and replica, three sentinels, PostgreSQL,
three instances and the load generator each on a host of its own, joined
by a router in which a partition is cut. flashload's verifier, on its own
host, checks the books after every run.

Needs root (network namespaces); where the tests cannot run, each says why
and is skipped, never passed."""
import re

import harness
from hosts import Net, World


def world(ctx, **kw):
    why = Net.why_not()
    if why:
        raise harness.Skip(why)
    return World(ctx, **kw)


def passed(rc, so, se):
    assert rc == 0, so + se
    assert re.search(r"verdict    PASS \(checked: client, api, (redis, )?postgresql\)", so), so


def test_three_instances_on_three_hosts_sell_exactly(ctx):
    """No shared file, no shared loopback: three instances on hosts of
    their own sell one product through Sentinel and PostgreSQL, and the
    verifier on a fourth host finds every 201 a row and nothing oversold."""
    w = world(ctx)
    for strategy in ("lua", "lock", "db"):
        passed(*w.flashload("--sku", "h-" + strategy, "--strategy", strategy, "--stock", 2000,
                            "--requests", 5000, "--connections", 48, "--users", 500,
                            "--quantity", "1-2"))
