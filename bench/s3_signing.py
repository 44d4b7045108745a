"""What signing an ``s3://`` range request costs refmount's client, by where its
credentials come from, in-process and without a network.

    python bench/s3_signing.py [--requests 20000] [--repeat 5]

Each row builds ``--requests`` signed ranged GETs (``request_head``, as
``HttpBackend.read`` does, the credentials asked first) on one trio loop and gives the
CPU microseconds per request, median of ``--repeat`` rounds:

  static          keys given in the options (no session token)
  static+token    keys and a session token given in the options
  process         an AWS profile's ``credential_process`` (botocore's chain), valid an
                  hour: looked up once, then the same frozen credentials
  process.renew   the same with credentials valid 2 s: renewed every second in a worker
                  thread while the requests are signed

The difference between rows is what temporary credentials add to each chunk's CPU
(``bench/throughput.py``'s ``refmount.process`` row measures it through a mount).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from refmount.fetch.http.backend import request_head, target_of  # noqa: E402
from refmount.fetch.http.s3 import S3Client, SigningCredentials, s3_client  # noqa: E402
from refmount.fetch.obstore_options import translate  # noqa: E402

PROCESS = """
import json, secrets, sys, time
expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + float(sys.argv[1])))
print(json.dumps({"Version": 1, "AccessKeyId": "ASIA" + secrets.token_hex(8).upper(),
                  "SecretAccessKey": secrets.token_urlsafe(30),
                  "SessionToken": secrets.token_urlsafe(60), "Expiration": expires}))
"""
ENDPOINT = "https://127.0.0.1:9000"


def client(options: dict[str, object]) -> S3Client:
    made = s3_client(translate("s3", {"endpoint_url": ENDPOINT, "region": "us-east-1", **options}))
    assert made is not None and made.credentials is not None
    return made


def profile(work: Path, name: str, lifetime: float) -> None:
    script = work / "process.py"
    script.write_text(PROCESS)
    command = shlex.join([sys.executable, str(script), f"{lifetime:g}"])
    with open(work / "config", "a") as config:
        config.write(f"[profile {name}]\ncredential_process = {command}\n")


def measure(s3: S3Client, requests: int) -> float:
    """CPU microseconds per signed request."""
    credentials: SigningCredentials = s3.credentials  # type: ignore[assignment]
    target = target_of("https", "127.0.0.1", 9000, "/bucket/chunks.bin")
    assert target is not None

    async def main() -> float:
        await credentials.signer()  # the lookup, not measured
        started = time.process_time()
        for n in range(requests):
            signer = await credentials.signer()
            start = n * 262_144
            request_head(target, start, start + 262_144, {}, None, s3, signer)
            if n % 256 == 0:
                await trio.sleep(0)  # let a renewal's task run, as a serving loop would
        return (time.process_time() - started) / requests * 1e6

    return trio.run(main)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        profile(Path(work), "hour", 3600)
        profile(Path(work), "short", 2)
        os.environ["AWS_CONFIG_FILE"] = str(Path(work) / "config")
        os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
        rows = {
            "static": {"key": "AKIDBENCH", "secret": "bench-secret"},
            "static+token": {"key": "AKIDBENCH", "secret": "bench-secret", "token": "t" * 80},
            "process": {"profile": "hour"},
            "process.renew": {"profile": "short"},
        }
        found: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.repeat):
            for name, options in rows.items():
                found[name].append(measure(client(options), args.requests))
    print(f"`python bench/s3_signing.py --requests {args.requests} --repeat {args.repeat}`, "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| credentials | µs CPU per signed request (median) | rounds |")
    print("|---|---|---|")
    for name, values in found.items():
        rounds = ", ".join(f"{v:.1f}" for v in values)
        print(f"| {name} | {statistics.median(values):.1f} | {rounds} |")
    print(json.dumps({name: statistics.median(v) for name, v in found.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
