"""refmount.malloc.bulk_allocations: under the daemon's fixed mmap threshold a
large temporary array is mapped afresh every time (a page fault per 4 KiB); within the
block the heap serves it again, and after it the threshold is back.  Counted in a fresh
process (mallopt is process-wide): minor page faults of the second of two arrays."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from refmount.malloc import is_glibc

# bytearrays, not numpy arrays: numpy asks for transparent huge pages for arrays of 4 MiB
# or more (madvise), and where the kernel has free 2 MiB pages an 8 MiB array then costs
# ~5 faults however it is allocated (a fresh-clone CI run saw (5, 0, 5)).
SCRIPT = """
import json, resource
from refmount.malloc import bulk_allocations, tune_malloc

def second_faults():
    bytearray(8 << 20)  # 8 MiB, zeroed (every page touched), freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    bytearray(8 << 20)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

assert tune_malloc()
fixed = second_faults()
with bulk_allocations():
    second_faults()  # the heap grows once
    bulk = second_faults()
print(json.dumps([fixed, bulk, second_faults()]))
"""


@pytest.mark.skipif(not is_glibc(), reason="glibc's mallopt")
def test_bulk_allocations_reuse_the_heap_then_restore_the_threshold() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          check=True)  # fmt: skip
    fixed, bulk, after = json.loads(done.stdout)
    # (the kernel maps a few pages per fault: 8 MiB cost ~500 faults on the CI machine)
    assert fixed >= 64, (fixed, bulk, after)  # mapped afresh: faulted in again
    assert bulk <= fixed // 8, (fixed, bulk, after)  # the heap's pages, reused
    assert after >= fixed // 2, (fixed, bulk, after)  # the fixed threshold is back
