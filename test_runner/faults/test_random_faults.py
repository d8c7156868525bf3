"""A randomized fault test: a bank-transfer workload on a compute whose WAL goes to three
safekeepers, while a seeded schedule kills -9 and restarts the compute, the pageserver and
one safekeeper at a time.

Every transfer moves an amount between two accounts and records itself in `transfers`, in
one transaction; a transfer whose COMMIT returned is *acknowledged*. At the end, on a fresh
compute: every acknowledged transfer is there, the balances still sum to what they started
at, and each account's balance is what the recorded transfers made of it.

A seed picks the schedule (the faults and the pauses between them; the timing of the
workload is real). `./scripts/test` runs two short schedules (`FJORD_FAULTS`, default 8
faults each): `[fixed-seed]`, seed 1 in every run, and `[random-seed]`, a seed drawn in each
run. The seed is printed (a line at the start of the test's output, and the run's summary
names it: `fault schedule seed`); a failure ends with the command that replays it:
`FJORD_FAULT_SEED=S` makes `[random-seed]` run seed S. `scripts/faults` runs one long
schedule that way and writes its numbers (`FJORD_FAULT_RESULTS`).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import psycopg
import pytest

from fixtures import logs
from fixtures.compute import Endpoint, Timeline

ACCOUNTS = 20
START_BALANCE = 1000
WORKERS = 3
FIXED_SEED = 1
TEST = "faults/test_random_faults.py::test_random_faults_lose_no_acknowledged_transfer"


class Bank(threading.Thread):
    """One worker: transfers until stopped, reconnecting (to the current compute) after
    errors; remembers which transfers were acknowledged."""

    def __init__(self, worker: int, target: dict, seed: int):
        super().__init__(daemon=True)
        self.worker = worker
        self.target = target
        self.rng = random.Random(seed * 1000 + worker)
        self.acked: list[int] = []
        self.errors = 0
        self.stopping = threading.Event()

    def run(self):
        conn = None
        n = 0
        while not self.stopping.is_set():
            n += 1
            tid = self.worker * 10_000_000 + n
            a, b = self.rng.sample(range(1, ACCOUNTS + 1), 2)
            amount = self.rng.randint(1, 50)
            try:
                if conn is None:
                    ep = self.target["ep"]
                    conn = psycopg.connect(f"host=127.0.0.1 port={ep.port} user={ep.user} dbname=postgres",
                                           autocommit=True, connect_timeout=5)
                with conn.transaction():
                    conn.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s", (amount, a))
                    conn.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s", (amount, b))
                    conn.execute("INSERT INTO transfers VALUES (%s, %s, %s, %s)", (tid, a, b, amount))
                self.acked.append(tid)
            except psycopg.Error:
                self.errors += 1
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.2)
        if conn is not None:
            conn.close()


def check_bank(ep: Endpoint, acked: set[int]) -> int:
    """The invariants on `ep`; returns how many transfers are recorded."""
    balances = dict(ep.sql("SELECT id, balance FROM accounts"))
    assert sum(balances.values()) == ACCOUNTS * START_BALANCE, f"the balances sum to {sum(balances.values())}"
    recorded = ep.sql("SELECT id, src, dst, amount FROM transfers")
    lost = sorted(acked - {r[0] for r in recorded})
    assert not lost, f"{len(lost)} acknowledged transfers lost, e.g. {lost[:10]}"
    expected = {i: START_BALANCE for i in range(1, ACCOUNTS + 1)}
    for _, src, dst, amount in recorded:
        expected[src] -= amount
        expected[dst] += amount
    assert balances == expected, "balances differ from what the recorded transfers make of them"
    return len(recorded)


# Expected: two transfers that lock the same accounts in opposite order (the workers retry).
@pytest.mark.allowed_errors(r"ERROR:  deadlock detected")
@pytest.mark.parametrize("schedule", ["fixed-seed", "random-seed"])
def test_random_faults_lose_no_acknowledged_transfer(tmp_path: Path, pageserver, safekeepers, schedule: str,
                                                     record_property):
    faults = int(os.environ.get("FJORD_FAULTS", "8"))
    if schedule == "fixed-seed":
        seed = FIXED_SEED
    elif "FJORD_FAULT_SEED" in os.environ:
        seed = int(os.environ["FJORD_FAULT_SEED"])
    else:
        seed = random.SystemRandom().randrange(2, 2**31)
    replay = (f"./scripts/test '{TEST}[fixed-seed]'" if schedule == "fixed-seed"
              else f"FJORD_FAULT_SEED={seed} ./scripts/test '{TEST}[random-seed]'")
    print(f"fault schedule seed {seed}, {faults} faults (replay: {replay})", flush=True)
    record_property("fault schedule seed", f"{seed} (replay: {replay})")
    try:
        run_schedule(tmp_path, pageserver, safekeepers, faults, seed)
    except BaseException as e:
        e.add_note(f"fault schedule seed {seed}; replay: {replay}")
        raise


def run_schedule(tmp_path: Path, pageserver, safekeepers, faults: int, seed: int) -> None:
    rng = random.Random(seed)
    # Computes and the pageserver are killed at random, also in the middle of a handshake.
    for service in (pageserver, *safekeepers):
        service.allowed_errors += logs.CLIENT_GONE_MID_HANDSHAKE
    tl = Timeline(tmp_path, pageserver)
    ep = Endpoint(tmp_path, tl, "ep0", safekeepers=safekeepers).start()
    ep.sql("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
    ep.sql("CREATE TABLE transfers (id bigint PRIMARY KEY, src int, dst int, amount int)")
    ep.sql(f"INSERT INTO accounts SELECT g, {START_BALANCE} FROM generate_series(1, {ACCOUNTS}) g")
    target = {"ep": ep}
    workers = [Bank(w, target, seed) for w in range(WORKERS)]
    for w in workers:
        w.start()
    done = {"compute": 0, "pageserver": 0, "safekeeper": 0}
    started = time.monotonic()
    for i in range(1, faults + 1):
        time.sleep(rng.uniform(1.0, 3.0))
        kind = rng.choice(list(done))
        if kind == "compute":
            target["ep"].kill()
            target["ep"] = Endpoint(tmp_path, tl, f"ep{i}", safekeepers=safekeepers).start()
        elif kind == "pageserver":
            pageserver.kill()
            time.sleep(rng.uniform(0.0, 1.0))
            pageserver.start()
        else:
            sk = rng.choice(safekeepers)
            sk.kill()
            time.sleep(rng.uniform(0.5, 3.0))
            sk.start()
        done[kind] += 1
    time.sleep(2)
    for w in workers:
        w.stopping.set()
    for w in workers:
        w.join(timeout=120)
        assert not w.is_alive(), "a worker hangs"
    elapsed = time.monotonic() - started
    acked = {t for w in workers for t in w.acked}
    errors = sum(w.errors for w in workers)
    assert len(acked) > 10 * faults, f"only {len(acked)} transfers acknowledged in {faults} faults ({errors} errors)"
    recorded_live = check_bank(target["ep"], acked)
    # A fresh compute, from the pageserver and the safekeepers.
    target["ep"].stop()
    fresh = Endpoint(tmp_path, tl, "final", safekeepers=safekeepers).start()
    recorded = check_bank(fresh, acked)
    assert recorded == recorded_live
    results = {
        "seed": seed, "faults": done, "seconds": round(elapsed, 1), "acknowledged": len(acked),
        "recorded": recorded, "unacknowledged_but_recorded": recorded - len(acked), "client_errors": errors,
        "transfers_per_s": round(len(acked) / elapsed, 1),
    }
    print("random faults:", json.dumps(results))
    if path := os.environ.get("FJORD_FAULT_RESULTS"):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(results, indent=1))
