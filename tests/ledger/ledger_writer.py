"""Child process for the ledger crash and concurrency tests (not collected by pytest).

Usage: python ledger_writer.py LEDGER TAG COUNT [wait]
With ``wait``, prints "ready" and waits for a line on stdin before writing (a start barrier),
then pauses a few milliseconds between appends, like a program doing work between releases,
so that a concurrent writer gets the lock in between.
Appends COUNT releases (COUNT 0 = forever) and prints each entry id on its own line
*after* its transaction committed, so every printed id must survive a SIGKILL.
"""

from __future__ import annotations

import sys
import time

from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.ledger.book import open_ledger
from dpaudit.records import Release


def main() -> None:
    path, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    event = SubsampledGaussian(noise_multiplier=1.1, sample_rate=0.01, steps=100)
    i = 0
    with open_ledger(path) as ledger:
        print("ready", flush=True)
        pause = len(sys.argv) > 4 and sys.argv[4] == "wait"
        if pause:
            sys.stdin.readline()
        while count == 0 or i < count:
            rel = Release(
                mechanism="test-writer",
                dataset={"name": "toy", "sha256": "0" * 64},
                adjacency="add-remove-record",
                accountant="rdp",
                epsilon=1.0,
                delta=1e-5,
                guarantee=event.to_dict(),
                seed=i,
                noise_source={"kind": "test"},
                partition=f"part-{tag}",
                git_commit=None,
            )
            eid = ledger.record(rel)
            sys.stdout.write(eid + "\n")
            sys.stdout.flush()
            i += 1
            if pause:
                time.sleep(0.005)


if __name__ == "__main__":
    main()
